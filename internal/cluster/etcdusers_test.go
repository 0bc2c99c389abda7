package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// etcd's users and roles reach every node through the log: a user added
// through the leader logs in on a follower, its writes through the
// follower are checked by its roles, and a password changed through the
// leader is refused on the follower too.
func TestEtcdUsersReachEveryNode(t *testing.T) {
	c := cluster.New(t, 3, cluster.WithEtcd(server.Compaction{}))
	leader, followers := leaderAndFollowers(t, c)
	root := etcdClient(t, leader)
	// Each password is a bcrypt, hashed on add and checked at each
	// login: at bcrypt's least cost in this harness, but the whole run
	// still gets a minute on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	steps := []func() error{
		func() error { _, err := root.RoleAdd(ctx, "app"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "app", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.UserAdd(ctx, "carol", "carol-pw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "carol", "app"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	// The follower may apply the last entries a moment after the leader.
	var carol *clientv3.Client
	for {
		var err error
		carol, err = clientv3.New(clientv3.Config{Endpoints: []string{followers[0].EtcdAddr()}, Username: "carol", Password: "carol-pw", DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("carol never logged in on %s: %v", followers[0], err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { carol.Close() })
	if _, err := carol.Put(ctx, "app/x", "1"); err != nil {
		t.Errorf("carol's put under app/ through a follower: got = %v, expected: allowed", err)
	}
	if _, err := carol.Put(ctx, "other", "1"); !errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
		t.Errorf("carol's put outside app/ through a follower: got = %v, expected: %v", err, rpctypes.ErrPermissionDenied)
	}
	if got, err := carol.Get(ctx, "app/x", clientv3.WithSerializable()); err != nil || len(got.Kvs) != 1 {
		t.Errorf("carol's serializable read on the follower: got = %v, %v, expected: app/x", got, err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{leader.EtcdAddr()}, Username: "root", Password: "root-pw", DialTimeout: 30 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.UserChangePassword(ctx, "carol", "new-pw"); err != nil {
		t.Fatal(err)
	}
	// The follower refuses the old password once it applied the change.
	for {
		_, err := etcdClient(t, followers[0]).Authenticate(ctx, "carol", "carol-pw")
		if errors.Is(rpctypes.Error(err), rpctypes.ErrAuthFailed) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("carol's old password on %s after the change: got = %v, expected: %v", followers[0], err, rpctypes.ErrAuthFailed)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

package server

import (
	"context"
	"io"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcd's maintenance and membership calls are its root user's; with a
// policy, admin on every namespace may make them, and nobody else.
func TestEtcdAdminCallsNeedAnAdmin(t *testing.T) {
	es := startEtcdAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep := es.etcd
	self := memberID(es.node.ID())
	calls := map[string]func(c adminClient) error{
		"Hash": func(c adminClient) error {
			_, err := c.Hash(ctx, &pb.HashRequest{})
			return err
		},
		"HashKV": func(c adminClient) error {
			_, err := c.HashKV(ctx, &pb.HashKVRequest{})
			return err
		},
		"Defragment": func(c adminClient) error {
			_, err := c.Defragment(ctx, &pb.DefragmentRequest{})
			return err
		},
		"MoveLeader": func(c adminClient) error {
			_, err := c.MoveLeader(ctx, &pb.MoveLeaderRequest{TargetID: self})
			return err
		},
		"Snapshot": func(c adminClient) error {
			s, err := c.Snapshot(ctx, &pb.SnapshotRequest{})
			if err != nil {
				return err
			}
			for {
				if _, err := s.Recv(); err != nil {
					if err == io.EOF {
						return nil
					}
					return err
				}
			}
		},
		"Alarm ACTIVATE": func(c adminClient) error {
			_, err := c.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: self, Alarm: pb.AlarmType_NONE})
			return err
		},
		"MemberAdd": func(c adminClient) error {
			_, err := c.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{"http://127.0.0.1:1"}, IsLearner: true})
			return err
		},
		"MemberUpdate": func(c adminClient) error {
			_, err := c.MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: memberID("127.0.0.1:1"), PeerURLs: []string{"http://127.0.0.1:2"}})
			return err
		},
		"MemberPromote": func(c adminClient) error {
			_, err := c.MemberPromote(ctx, &pb.MemberPromoteRequest{ID: self})
			return err
		},
		"MemberRemove": func(c adminClient) error {
			_, err := c.MemberRemove(ctx, &pb.MemberRemoveRequest{ID: memberID("127.0.0.1:1")})
			return err
		},
	}
	order := []string{"Hash", "HashKV", "Defragment", "MoveLeader", "Snapshot", "Alarm ACTIVATE", "MemberAdd", "MemberUpdate", "MemberPromote", "MemberRemove"}
	alice, admin := newAdminClient(es.client(t, "alice", "alice-pw")), newAdminClient(es.client(t, "admin", "admin-pw"))
	for _, name := range order {
		if err := calls[name](alice); !isEtcdErr(err, rpctypes.ErrGRPCPermissionDenied) {
			t.Errorf("alice: %s: got = %v, expected: %v", name, err, rpctypes.ErrGRPCPermissionDenied)
		}
	}
	for _, name := range order {
		err := calls[name](admin)
		switch {
		case name == "MemberPromote":
			// Past the admission: the node votes already.
			if !isEtcdErr(err, rpctypes.ErrGRPCMemberNotLearner) {
				t.Errorf("admin: %s of a voter: got = %v, expected: %v", name, err, rpctypes.ErrGRPCMemberNotLearner)
			}
		case err != nil:
			t.Errorf("admin: %s on %s: got = %v, expected: success", name, ep, err)
		}
	}
}

// adminClient makes etcd's maintenance and cluster calls on a clientv3
// connection, which carries the client's token.
type adminClient struct {
	pb.MaintenanceClient
	pb.ClusterClient
}

func newAdminClient(c *clientv3.Client) adminClient {
	return adminClient{pb.NewMaintenanceClient(c.ActiveConnection()), pb.NewClusterClient(c.ActiveConnection())}
}

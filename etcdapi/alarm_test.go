package etcdapi

import (
	"context"
	"errors"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurehq/tenure/statemachine"
)

// A NOSPACE alarm raised through the log: Alarm GET and Status list it,
// a Put and a LeaseGrant are refused in etcd's words while a read and a
// delete go on, and `etcdctl alarm disarm` clears it through the log.
func TestTheQuotaAlarmIsListedObeyedAndDisarmed(t *testing.T) {
	b := newFakeBackend(t)
	c := serve(t, b)
	ctx := context.Background()
	if _, err := c.Put(ctx, "/a", "1"); err != nil {
		t.Fatal(err)
	}
	if res := b.apply(statemachine.SetAlarm{Member: "fake", Alarm: statemachine.AlarmNoSpace, Active: true}); res.Err != nil {
		t.Fatal(res.Err)
	}
	nospace := &pb.AlarmMember{MemberID: 2, Alarm: pb.AlarmType_NOSPACE}
	list, err := c.AlarmList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Alarms) != 1 || list.Alarms[0].String() != nospace.String() {
		t.Fatalf("alarms: got = %v, expected: %v", list.Alarms, nospace)
	}
	st, err := c.Status(ctx, c.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Errors) != 1 || st.Errors[0] != nospace.String() {
		t.Errorf("Status errors: got = %q, expected: [%q]", st.Errors, nospace.String())
	}
	if _, err := c.Put(ctx, "/b", "2"); !errors.Is(err, rpctypes.ErrNoSpace) || err.Error() != "etcdserver: mvcc: database space exceeded" {
		t.Errorf("Put under NOSPACE: got = %v, expected: %v", err, rpctypes.ErrNoSpace)
	}
	if _, err := c.Grant(ctx, 10); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Errorf("LeaseGrant under NOSPACE: got = %v, expected: %v", err, rpctypes.ErrNoSpace)
	}
	if got, err := c.Get(ctx, "/a"); err != nil || len(got.Kvs) != 1 {
		t.Errorf("Get under NOSPACE: got = %v, %v, expected: /a", got, err)
	}
	if got, err := c.Delete(ctx, "/a"); err != nil || got.Deleted != 1 {
		t.Errorf("Delete under NOSPACE: got = %v, %v, expected: 1 deleted", got, err)
	}
	resp, err := c.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: 2, Alarm: pb.AlarmType_NOSPACE})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Alarms) != 1 || resp.Alarms[0].String() != nospace.String() {
		t.Errorf("disarm: got = %v, expected: %v", resp.Alarms, nospace)
	}
	if list, _ := c.AlarmList(ctx); len(list.Alarms) != 0 {
		t.Errorf("alarms after the disarm: got = %v, expected: none", list.Alarms)
	}
	if _, err := c.Put(ctx, "/b", "2"); err != nil {
		t.Errorf("Put after the disarm: got = %v, expected: nil", err)
	}
}

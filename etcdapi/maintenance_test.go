package etcdapi

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
)

// nodeBackend is a fake Backend that describes the node as info says,
// and authenticates with authenticate when it is set (a policy in
// force).
type nodeBackend struct {
	*fakeBackend
	authenticate func(name, password string) (string, error)

	mu   sync.Mutex // guards info: tests change it while the server runs
	info NodeInfo
}

func (b *nodeBackend) Node(context.Context) (NodeInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.info, nil
}

// set changes what Node reports.
func (b *nodeBackend) set(change func(*NodeInfo)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	change(&b.info)
}

func (b *nodeBackend) Authenticate(_ context.Context, name, password string) (string, error) {
	if b.authenticate == nil {
		return "", rpctypes.ErrGRPCAuthNotEnabled
	}
	return b.authenticate(name, password)
}

func (b *nodeBackend) AuthEnabled() bool { return b.authenticate != nil }

// threeNodes is a node, member 2 of three, of a cluster whose leader is
// member 3.
func threeNodes(t *testing.T) *nodeBackend {
	return &nodeBackend{fakeBackend: newFakeBackend(t), info: NodeInfo{
		ClusterID: 1, MemberID: 2, Name: "node2", LeaderID: 3, RaftTerm: 7,
		RaftIndex: 120, Applied: 118, DBSize: 4096, Version: "v1.4.0",
		Members: []Member{
			{ID: 2, Name: "node2", PeerURLs: []string{"http://127.0.0.1:7481"}, ClientURLs: []string{"http://127.0.0.1:2379"}},
			{ID: 3, Name: "node3", PeerURLs: []string{"http://127.0.0.1:7491"}, ClientURLs: []string{"http://127.0.0.1:2389"}},
			{ID: 4, Name: "node4", PeerURLs: []string{"http://127.0.0.1:7501"}, IsLearner: true},
		},
	}}
}

// put writes key as the KV service would, to move the KV revision.
func put(t *testing.T, f *fakeBackend, key string) int64 {
	t.Helper()
	res := f.apply(statemachine.Txn{Success: []statemachine.TxnOp{{Type: statemachine.OpPut, Key: key, Value: "v"}}})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	return res.KVRevision
}

func TestStatusDescribesTheNodeAsEtcdDoes(t *testing.T) {
	b := threeNodes(t)
	rev := put(t, b.fakeBackend, "a")
	c := serve(t, b)
	ctx := context.Background()
	ep := c.Endpoints()[0]

	st, err := c.Status(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != "3.5.13+tenure.v1.4.0" {
		t.Errorf("version: got = %q, expected: the etcd API version with Tenure's as build metadata", st.Version)
	}
	got := []any{st.Leader, st.RaftTerm, st.RaftIndex, st.RaftAppliedIndex, st.DbSize, st.DbSizeInUse, st.IsLearner, len(st.Errors)}
	want := []any{uint64(3), uint64(7), uint64(120), uint64(118), int64(4096), int64(4096), false, 0}
	if !slices.Equal(got, want) {
		t.Errorf("leader, term, index, applied, db size, in use, learner, errors: got = %v, expected: %v", got, want)
	}
	if h := st.Header; h.ClusterId != 1 || h.MemberId != 2 || h.Revision != rev {
		t.Errorf("header: got = %v, expected: cluster 1, member 2, revision %d", h, rev)
	}

	// No leader and a full disk: etcd's words in Errors.
	b.set(func(i *NodeInfo) { i.LeaderID, i.NoSpace, i.Learner = 0, "disk full: 12 MiB free", true })
	st, err = c.Status(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	wantErrs := []string{"etcdserver: no leader", "memberID:2 alarm:NOSPACE "}
	if !slices.Equal(st.Errors, wantErrs) || !st.IsLearner {
		t.Errorf("errors, learner: got = %q, %v, expected: %q, true", st.Errors, st.IsLearner, wantErrs)
	}
}

func TestStatusVersionIsSemverWithTenuresVersionAsBuildMetadata(t *testing.T) {
	semver := regexp.MustCompile(`^3\.5\.13(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)
	for tenure, want := range map[string]string{
		"":                          "3.5.13",
		"v1.4.0":                    "3.5.13+tenure.v1.4.0",
		"v0.0.0-20261125-abc+dirty": "3.5.13+tenure.v0.0.0-20261125-abc-dirty",
		"(devel)":                   "3.5.13+tenure.devel",
		"v1..2.":                    "3.5.13+tenure.v1.2",
		"()":                        "3.5.13",
	} {
		got := statusVersion(tenure)
		if got != want || !semver.MatchString(got) {
			t.Errorf("statusVersion(%q): got = %q, expected: %q, valid semver", tenure, got, want)
		}
	}
}

func TestAlarmListsNospaceWhileTheDiskIsFullAndClientsCannotChangeIt(t *testing.T) {
	b := threeNodes(t)
	c := serve(t, b)
	mc := pb.NewMaintenanceClient(c.ActiveConnection())
	ctx := context.Background()
	nospace := &pb.AlarmMember{MemberID: 2, Alarm: pb.AlarmType_NOSPACE}

	list := func() []*pb.AlarmMember {
		t.Helper()
		resp, err := c.AlarmList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Alarms
	}
	if got := list(); len(got) != 0 {
		t.Fatalf("alarms with room on the disk: got = %v, expected: none", got)
	}
	b.set(func(i *NodeInfo) { i.NoSpace = "disk full" })
	if got := list(); len(got) != 1 || got[0].String() != nospace.String() {
		t.Fatalf("alarms with a full disk: got = %v, expected: %v", got, nospace)
	}
	for _, c := range []struct {
		name string
		req  *pb.AlarmRequest
		want []*pb.AlarmMember
		code codes.Code
	}{
		{"GET of NOSPACE lists it", &pb.AlarmRequest{Action: pb.AlarmRequest_GET, Alarm: pb.AlarmType_NOSPACE}, []*pb.AlarmMember{nospace}, codes.OK},
		{"GET of CORRUPT lists nothing", &pb.AlarmRequest{Action: pb.AlarmRequest_GET, Alarm: pb.AlarmType_CORRUPT}, nil, codes.OK},
		{"ACTIVATE of NONE changes nothing, as in etcd", &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: 2}, nil, codes.OK},
		{"ACTIVATE of the raised alarm answers it, as etcd does", &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: 2, Alarm: pb.AlarmType_NOSPACE}, []*pb.AlarmMember{nospace}, codes.OK},
		{"ACTIVATE for a member that is none is refused", &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: 9, Alarm: pb.AlarmType_NOSPACE}, nil, codes.NotFound},
		{"ACTIVATE of CORRUPT is refused", &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: 2, Alarm: pb.AlarmType_CORRUPT}, nil, codes.Unimplemented},
		{"DEACTIVATE disarms nothing", &pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE, MemberID: 2, Alarm: pb.AlarmType_NOSPACE}, nil, codes.OK},
	} {
		resp, err := mc.Alarm(ctx, c.req)
		if status.Code(err) != c.code {
			t.Errorf("%s: got = %v, expected: code %v", c.name, err, c.code)
			continue
		}
		if err != nil {
			if c.code == codes.Unimplemented && !strings.Contains(err.Error(), "Maintenance.Alarm ACTIVATE") {
				t.Errorf("%s: got = %v, expected: a message naming Maintenance.Alarm ACTIVATE", c.name, err)
			}
			continue
		}
		if len(resp.Alarms) != len(c.want) || len(c.want) == 1 && resp.Alarms[0].String() != c.want[0].String() {
			t.Errorf("%s: got = %v, expected: %v", c.name, resp.Alarms, c.want)
		}
		if resp.Header == nil || resp.Header.MemberId != 2 {
			t.Errorf("%s: header got = %v, expected: member 2's", c.name, resp.Header)
		}
	}
	// etcdctl alarm disarm: nothing is disarmed while the disk is full.
	if _, err := c.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: 2, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	if got := list(); len(got) != 1 {
		t.Errorf("alarms after a disarm with the disk still full: got = %v, expected: NOSPACE still", got)
	}
	b.set(func(i *NodeInfo) { i.NoSpace = "" })
	if got := list(); len(got) != 0 {
		t.Errorf("alarms once the disk has room: got = %v, expected: none", got)
	}
}

// unimplementedCase is a call that answers Unimplemented, and what its
// message must name.
type unimplementedCase struct {
	call func(context.Context) error
	want []string
}

func TestDowngradeNamesTenuresOwnWay(t *testing.T) {
	c := serve(t, threeNodes(t))
	mc := pb.NewMaintenanceClient(c.ActiveConnection())
	checkUnimplemented(t, map[string]unimplementedCase{
		"Downgrade": {func(ctx context.Context) error { _, err := mc.Downgrade(ctx, &pb.DowngradeRequest{}); return err }, []string{"Maintenance.Downgrade"}},
	})
}

func checkUnimplemented(t *testing.T, cases map[string]unimplementedCase) {
	t.Helper()
	for name, c := range cases {
		err := c.call(context.Background())
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: got = %v, expected: Unimplemented", name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(status.Convert(err).Message(), w) {
				t.Errorf("%s: got = %q, expected: a message naming %q", name, status.Convert(err).Message(), w)
			}
		}
	}
}

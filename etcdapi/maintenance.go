package etcdapi

import (
	"context"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
)

// APIVersion is the etcd API version Tenure speaks, as Status reports
// it: etcd 3.5's, whose protos, semantics and error texts this package
// follows. It names the API level, not an etcd release, but clients do
// read its patch number: kube-apiserver (k8s.io/apiserver's
// feature_support_checker.go) takes 3.5.0 to 3.5.12 for releases with
// etcd's watch progress bugs (etcd#15220, #17507) and then turns off
// RequestWatchProgress, consistent reads from its watch cache and
// streaming lists. Tenure's watch has the fixed behaviour (events up to
// a progress notification's revision come before it:
// watch_progress_test.go), so it reports 3.5.13, the first release
// with both fixes.
const APIVersion = "3.5.13"

// statusVersion is Status's version: APIVersion, with Tenure's own
// version as semver build metadata ("3.5.13+tenure.v1.4.0"), where
// etcdctl endpoint status shows it to the user. etcd 3.5's
// StatusResponse has no field for a server's own version (storage
// version is 3.6's, and means something else), and build metadata is
// the part of a version that semver tells every reader to ignore when
// comparing, so no client takes Tenure's number for etcd's.
func statusVersion(tenure string) string {
	if tenure == "" {
		return APIVersion
	}
	// Build metadata is dot-separated runs of [0-9A-Za-z-].
	meta := strings.Map(func(r rune) rune {
		switch {
		case r >= '0' && r <= '9', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '-', r == '.':
			return r
		}
		return '-'
	}, tenure)
	return APIVersion + "+tenure." + strings.Trim(meta, ".")
}

// maintenanceServer serves Maintenance: Status and Alarm from what the
// Backend says of the node; the rest answer Unimplemented and name
// Tenure's own way to do it, where there is one.
type maintenanceServer struct {
	b Backend
}

var _ pb.MaintenanceServer = (*maintenanceServer)(nil)

func newMaintenance(b Backend) *maintenanceServer { return &maintenanceServer{b: b} }

// currentRevision is this node's KV revision, for the header of a
// response that reads no keys (etcd's maintenance headers carry it).
func currentRevision(ctx context.Context, b Backend) (int64, error) {
	var rev int64
	err := b.Read(ctx, true, func(m *statemachine.Machine) error {
		rev = m.KVRevision()
		return nil
	})
	return rev, err
}

// noSpace is the NOSPACE alarm of member id.
func noSpace(id uint64) *pb.AlarmMember {
	return &pb.AlarmMember{MemberID: id, Alarm: pb.AlarmType_NOSPACE}
}

// Status describes this node as etcd's Status does: the leader, raft
// term and indexes, the size of the data dir as the database's, whether
// it is a learner, and in Errors "etcdserver: no leader" without a
// leader and the NOSPACE alarm while the node refuses writes for a full
// disk, in etcd's words.
func (s *maintenanceServer) Status(ctx context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	info, err := s.b.Node(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	rev, err := currentRevision(ctx, s.b)
	if err != nil {
		return nil, toGRPC(err)
	}
	resp := &pb.StatusResponse{
		Header:           header(s.b, rev),
		Version:          statusVersion(info.Version),
		DbSize:           info.DBSize,
		DbSizeInUse:      info.DBSize, // nothing to defragment: all of it is in use
		Leader:           info.LeaderID,
		RaftIndex:        info.RaftIndex,
		RaftTerm:         info.RaftTerm,
		RaftAppliedIndex: info.Applied,
		IsLearner:        info.Learner,
	}
	if info.LeaderID == 0 {
		resp.Errors = append(resp.Errors, rpctypes.ErrNoLeader.Error())
	}
	alarms, err := s.alarms(ctx, info)
	if err != nil {
		return nil, toGRPC(err)
	}
	for _, a := range alarms {
		resp.Errors = append(resp.Errors, a.String())
	}
	return resp, nil
}

// alarms are the alarms raised through the log, and this member's
// NOSPACE while its disk is full, once each.
func (s *maintenanceServer) alarms(ctx context.Context, info NodeInfo) ([]*pb.AlarmMember, error) {
	alarms, err := s.b.Alarms(ctx)
	if err != nil {
		return nil, err
	}
	if info.NoSpace != "" && !slices.ContainsFunc(alarms, func(a *pb.AlarmMember) bool {
		return a.MemberID == info.MemberID && a.Alarm == pb.AlarmType_NOSPACE
	}) {
		alarms = append(alarms, noSpace(info.MemberID))
	}
	return alarms, nil
}

// Alarm answers as etcd's does, over two kinds of NOSPACE alarm:
//
//   - a member's NOSPACE raised through the log once it held its storage
//     quota (--quota-backend-bytes; Backend.Alarms), which every member
//     lists and obeys, and which DEACTIVATE (`etcdctl alarm disarm`)
//     clears through the log, as etcd's does: a member still over its
//     quota raises it again at the next write that adds data;
//   - this member's NOSPACE while its disk is full (NodeInfo.NoSpace),
//     which the node raises and clears itself: DEACTIVATE changes
//     nothing of it, the alarm ends when the disk has room again.
//
// So GET lists the alarms raised, for alarm type NONE (all) or NOSPACE;
// ACTIVATE of NONE changes nothing, as in etcd, and ACTIVATE of NOSPACE
// for a member whose alarm is raised answers it, as etcd answers an
// alarm that was already raised; any other ACTIVATE is refused
// (Unimplemented): clients cannot raise Tenure's alarms, and it has no
// CORRUPT alarm. DEACTIVATE of an alarm not raised answers no alarm, as
// etcd's does.
func (s *maintenanceServer) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	info, err := s.b.Node(ctx)
	if err != nil {
		return nil, toGRPC(err)
	}
	rev, err := currentRevision(ctx, s.b)
	if err != nil {
		return nil, toGRPC(err)
	}
	alarms, err := s.alarms(ctx, info)
	if err != nil {
		return nil, toGRPC(err)
	}
	raised := slices.ContainsFunc(alarms, func(a *pb.AlarmMember) bool { return a.MemberID == r.MemberID && a.Alarm == r.Alarm })
	resp := &pb.AlarmResponse{Header: header(s.b, rev)}
	switch r.Action {
	case pb.AlarmRequest_GET:
		for _, a := range alarms {
			if r.Alarm == pb.AlarmType_NONE || r.Alarm == a.Alarm {
				resp.Alarms = append(resp.Alarms, a)
			}
		}
	case pb.AlarmRequest_ACTIVATE:
		switch {
		case r.Alarm == pb.AlarmType_NONE:
		case r.Alarm == pb.AlarmType_NOSPACE && raised:
			resp.Alarms = append(resp.Alarms, &pb.AlarmMember{MemberID: r.MemberID, Alarm: r.Alarm})
		default:
			return nil, status.Errorf(codes.Unimplemented,
				"Tenure does not implement Maintenance.Alarm ACTIVATE of %s for member %x: a node raises NOSPACE itself past its storage quota or while its disk is full, and there is no other alarm",
				r.Alarm, r.MemberID)
		}
	case pb.AlarmRequest_DEACTIVATE:
		err := s.b.Disarm(ctx, r.MemberID, r.Alarm)
		switch {
		case err == nil:
			resp.Alarms = append(resp.Alarms, &pb.AlarmMember{MemberID: r.MemberID, Alarm: r.Alarm})
		case raised && r.MemberID == info.MemberID && info.NoSpace != "":
			// The disk's alarm, which only room on the disk ends.
		case raised:
			return nil, toGRPC(err)
		}
	}
	return resp, nil
}

func unimplemented(method, instead string) error {
	return status.Errorf(codes.Unimplemented, "Tenure does not implement %s: %s", method, instead)
}

func (s *maintenanceServer) Defragment(context.Context, *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	return nil, unimplemented("Maintenance.Defragment", "it keeps its state in memory, and its log and snapshots on disk are compacted by the node itself; there is nothing to defragment")
}

func (s *maintenanceServer) Hash(context.Context, *pb.HashRequest) (*pb.HashResponse, error) {
	return nil, unimplemented("Maintenance.Hash", "it has no etcd backend database to hash")
}

func (s *maintenanceServer) HashKV(context.Context, *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	return nil, unimplemented("Maintenance.HashKV", "it has no etcd backend database to hash")
}

func (s *maintenanceServer) Snapshot(*pb.SnapshotRequest, pb.Maintenance_SnapshotServer) error {
	return unimplemented("Maintenance.Snapshot", "Tenure's snapshots are not etcd databases: take one with `tenure snapshot save FILE` and restore it with `tenure snapshot restore FILE --data-dir DIR`")
}

func (s *maintenanceServer) MoveLeader(context.Context, *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	return nil, unimplemented("Maintenance.MoveLeader", "move leadership with `tenure members transfer-leadership [ID]`")
}

func (s *maintenanceServer) Downgrade(context.Context, *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	return nil, unimplemented("Maintenance.Downgrade", "a Tenure cluster has cluster versions of its own, not etcd's (docs/operations.md, Upgrade one node at a time)")
}

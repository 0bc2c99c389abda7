package etcdapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
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
	// Build metadata is dot-separated identifiers of [0-9A-Za-z-]; any
	// other byte becomes "-", and the hyphens that leaves at an
	// identifier's ends go, so that an unstamped build's "(devel)" reads
	// "devel", not "-devel-".
	var ids []string
	for id := range strings.SplitSeq(tenure, ".") {
		id = strings.Trim(strings.Map(func(r rune) rune {
			switch {
			case r >= '0' && r <= '9', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '-':
				return r
			}
			return '-'
		}, id), "-")
		if id != "" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return APIVersion
	}
	return APIVersion + "+tenure." + strings.Join(ids, ".")
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
// ACTIVATE of NONE changes nothing, as in etcd; ACTIVATE of NOSPACE
// raises the member's alarm through the log (Backend.Arm), as etcd's
// does, with the same effect as a quota's, and answers it, as etcd
// answers an alarm it raised or that was raised already; the member
// must be one of the cluster's (etcd takes any ID). Tenure has no
// CORRUPT alarm: ACTIVATE of it is refused (Unimplemented). DEACTIVATE
// of an alarm not raised answers no alarm, as etcd's does.
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
		case r.Alarm == pb.AlarmType_NOSPACE:
			if !raised {
				if err := s.b.Arm(ctx, r.MemberID, r.Alarm); err != nil {
					return nil, toGRPC(err)
				}
			}
			resp.Alarms = append(resp.Alarms, &pb.AlarmMember{MemberID: r.MemberID, Alarm: r.Alarm})
		default:
			return nil, status.Errorf(codes.Unimplemented,
				"Tenure does not implement Maintenance.Alarm ACTIVATE of %s for member %x: Tenure's only alarm is NOSPACE",
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

// Defragment succeeds at once, as etcd's does on a database with nothing
// to give back: Tenure has no etcd database whose freed pages would wait
// for a defragmentation. Its state lives in memory, and on disk it keeps
// a log and snapshots that the node compacts itself: a snapshot replaces
// the log before it, and the log's segments go once a snapshot covers
// them, so the bytes on disk follow the state without an operator's
// help (Status's dbSizeInUse is its dbSize). As etcd's, the answer
// carries no header.
func (s *maintenanceServer) Defragment(ctx context.Context, r *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	if _, err := s.b.Node(ctx); err != nil {
		return nil, toGRPC(err)
	}
	return &pb.DefragmentResponse{}, nil
}

// Hash is etcd's hash of the whole store, on this member as it stands
// (not through the leader, as in etcd): a CRC-32 (Castagnoli) of the
// node's whole state as a snapshot writes it — every key, its history,
// sessions, leases, holders, waiters, members and alarms. Two members
// that applied the same log write the same snapshot, so they answer the
// same hash at the same applied index; as etcd's, it is only worth
// comparing between members that have applied the same writes (compare
// HashKV at a revision instead). The header's revision is the KV
// revision the hash was taken at.
func (s *maintenanceServer) Hash(ctx context.Context, r *pb.HashRequest) (*pb.HashResponse, error) {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	var rev int64
	err := s.b.Read(ctx, true, func(m *statemachine.Machine) error {
		rev = m.KVRevision()
		return m.Snapshot(h)
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.HashResponse{Header: header(s.b, rev), Hash: h.Sum32()}, nil
}

// HashKV is etcd's hash of the keys' history up to a revision (0: the
// current one), on this member as it stands, computed as etcd computes
// it (hashKV): equal on every member at the same revision, and equal to
// etcd's for the same history when no key is attached to a lease (lease
// IDs are the only field whose values Tenure and etcd choose apart).
func (s *maintenanceServer) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	var hash uint32
	var current, compact int64
	err := s.b.Read(ctx, true, func(m *statemachine.Machine) error {
		current, compact = m.KVRevision(), m.CompactRevision()
		var err error
		hash, err = hashKV(m, r.Revision)
		return err
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.HashKVResponse{Header: header(s.b, current), Hash: hash, CompactRevision: compact}, nil
}

// hashKV is etcd's HashKV (mvcc hashByRev and kvHasher) over m's key
// history: a CRC-32 (Castagnoli) of the name of etcd's key bucket, then,
// in revision order, of each kept version's key and value in the bucket
// as etcd writes them, up to revision rev. A version's key is its
// revision, 8 bytes of main revision big-endian, '_', 8 bytes of sub
// revision (its place in its Txn), and a 't' for a deletion; its value
// is the etcd KeyValue (mvccpb) in protobuf, only the key for a
// deletion. Of the versions at or before the compact revision, as etcd
// only those still current at rev are hashed, unless no key has a value
// at rev; a deletion at the compact revision is not.
//
// The history holds what etcd's key bucket holds once a compaction has
// run (statemachine.Machine.History), so the hash is etcd's for the
// same writes. rev below the compact revision is ErrCompacted, above
// the current one ErrFutureRevision, as in etcd.
func hashKV(m *statemachine.Machine, rev int64) (uint32, error) {
	current, compact := m.KVRevision(), m.CompactRevision()
	switch {
	case rev > 0 && rev < compact:
		return 0, fmt.Errorf("%w: %d (compacted at %d)", statemachine.ErrCompacted, rev, compact)
	case rev > current:
		return 0, fmt.Errorf("%w: %d (current %d)", statemachine.ErrFutureRevision, rev, current)
	case rev <= 0:
		rev = current
	}
	type at struct{ main, sub int64 }
	// What etcd's index keeps at rev: each key's last version at or
	// before it, unless that is a deletion.
	last := map[string]statemachine.KeyVersion{}
	m.History(func(v statemachine.KeyVersion) bool {
		if v.Main > rev {
			return false
		}
		last[v.Key] = v
		return true
	})
	keep := map[at]bool{}
	for _, v := range last {
		if v.KV != nil {
			keep[at{v.Main, v.Sub}] = true
		}
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	h.Write([]byte("key"))
	var key [17]byte
	var err error
	m.History(func(v statemachine.KeyVersion) bool {
		if v.Main > rev {
			return false
		}
		if v.Main <= compact && len(keep) > 0 && !keep[at{v.Main, v.Sub}] {
			return true
		}
		if v.Main == compact && v.KV == nil {
			return true
		}
		binary.BigEndian.PutUint64(key[:8], uint64(v.Main))
		key[8] = '_'
		binary.BigEndian.PutUint64(key[9:], uint64(v.Sub))
		kv := mvccpb.KeyValue{Key: []byte(v.Key)}
		k := key[:]
		if v.KV == nil {
			k = append(k, 't')
		} else {
			kv = mvccpb.KeyValue{
				Key: []byte(v.Key), Value: []byte(v.KV.Value),
				CreateRevision: v.KV.CreateRevision, ModRevision: v.KV.ModRevision,
				Version: v.KV.Version, Lease: v.KV.EtcdLease(),
			}
		}
		var b []byte
		if b, err = kv.Marshal(); err != nil {
			return false
		}
		h.Write(k)
		h.Write(b)
		return true
	})
	return h.Sum32(), err
}

// snapshotChunk is the size of a Snapshot stream's pieces: etcd's.
const snapshotChunk = 32 << 10

// Snapshot streams this member's whole state as etcd's Snapshot streams
// its database, so that etcdctl snapshot save writes it, and tenure
// snapshot restore starts a new cluster from the file: Tenure's own
// snapshot in the wrapping WrapSnapshot describes, then its sha256 in a
// message of its own, as etcd sends it. On a follower the state is first
// brought up to every write the leader had acknowledged (Backend.Sync),
// so the copy holds every write acknowledged before the call, wherever
// it is made; etcd's holds what the member it reached had applied.
func (s *maintenanceServer) Snapshot(r *pb.SnapshotRequest, srv pb.Maintenance_SnapshotServer) error {
	ctx := srv.Context()
	s.b.Sync(ctx)
	var state bytes.Buffer
	err := s.b.Read(ctx, true, func(m *statemachine.Machine) error {
		return m.Snapshot(&state)
	})
	if err != nil {
		return toGRPC(err)
	}
	data := WrapSnapshot(state.Bytes())
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	for len(body) > 0 {
		n := min(len(body), snapshotChunk)
		if err := srv.Send(&pb.SnapshotResponse{RemainingBytes: uint64(len(body) - n), Blob: body[:n]}); err != nil {
			return err
		}
		body = body[n:]
	}
	return srv.Send(&pb.SnapshotResponse{Blob: sum})
}

// MoveLeader hands leadership to member TargetID, as etcd's does, on
// whichever member it is made: a follower forwards it to the leader
// (etcd answers "not leader" there). It answers once the target leads;
// ErrBadLeaderTransferee when the target is not a voting member, as
// etcd. Its answer carries no header, as etcd's does not.
func (s *maintenanceServer) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	if err := s.b.MoveLeader(ctx, r.TargetID); err != nil {
		return nil, toGRPC(err)
	}
	return &pb.MoveLeaderResponse{}, nil
}

func (s *maintenanceServer) Downgrade(context.Context, *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	return nil, unimplemented("Maintenance.Downgrade", "a Tenure cluster has cluster versions of its own, not etcd's (docs/operations.md, Upgrade one node at a time)")
}

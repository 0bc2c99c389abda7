package server

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/tenurehq/tenure/statemachine"
)

// The storage quota is etcd's --quota-backend-bytes, mapped onto what
// Tenure holds. etcd counts its bbolt file, where its keys and their
// history live; Tenure keeps both in memory, so it counts the bytes it
// holds there: the state machine's live keys, retained history, sessions
// and leases (statemachine.Usage, a deterministic model of the heap), the
// watch history (watch.Hub.Bytes) and the raft log entries kept in
// memory (raftnode.Node.LogMemoryBytes).
//
// Past the quota the node raises etcd's NOSPACE alarm through the log,
// so that every member refuses alike from that entry on and the alarm
// survives restarts and snapshots; the state machine then refuses every
// command that adds data (statemachine.AddsData) with ErrNoSpace, and
// reads, deletes, compaction, releases, revokes and closing sessions go
// on. An operator clears it with etcd's Alarm DEACTIVATE (`etcdctl alarm
// disarm`) once deletes and compaction made room; a node still over its
// quota raises it again at the next write, as etcd's does.
//
// Two things keep a node under its quota without an operator: the
// automatic compaction by bytes (compaction.go), which compacts the
// history, oldest first, once it passes a quarter of the quota, and the watch
// history's byte budget, an eighth of the quota; the raft log in memory
// is bounded to an eighth too (at most 64 MiB). What is left for live
// data is the rest: a node whose live keys alone pass the quota raises
// NOSPACE, as an etcd whose live keys fill its quota does.

// DefaultQuotaBackendBytes is etcd's default quota, 2 GiB.
const DefaultQuotaBackendBytes = 2 << 30

// StorageQuota bounds the bytes a node holds.
type StorageQuota struct {
	// Bytes is the quota (--quota-backend-bytes): 0 means
	// DefaultQuotaBackendBytes, as in etcd, and below 0 no quota, as
	// etcd's negative quota turns it off.
	Bytes int64
	// Interval is how often the leader compares what it holds with the
	// quota and compacts by bytes (default a second). A write checks the
	// quota itself, so this only bounds how soon compaction and an alarm
	// follow writes that stopped.
	Interval time.Duration
}

// limit is the quota in bytes, or 0 for none.
func (q StorageQuota) limit() int64 {
	switch {
	case q.Bytes == 0:
		return DefaultQuotaBackendBytes
	case q.Bytes < 0:
		return 0
	}
	return q.Bytes
}

// watchHistoryBytes is the watch history's budget: an eighth of the
// quota, so that the history, which keeps values after the store let
// them go, cannot hold a large share of it (0: the hub's own bound).
func (q StorageQuota) watchHistoryBytes() int64 { return q.limit() / 8 }

// raftLogBytes bounds the raft log entries kept in memory
// (raftnode.Config.MaxLogMemoryBytes) when the configuration leaves it
// unset: an eighth of the quota, at most raftnode's own default of 64
// MiB and at least the 1 MiB it takes (0: raftnode's default).
func (q StorageQuota) raftLogBytes() int64 {
	if q.limit() == 0 {
		return 0
	}
	return min(max(q.limit()/8, 1<<20), 64<<20)
}

// historyCompactionBytes is where the compaction by bytes starts: when
// the keys' retained history passes a quarter of the quota. It compacts
// down to an eighth, so that it does not compact again at every look.
// A quarter leaves the rest to live data, the watch history and the raft
// log: a node whose live keys stay under about a third of its quota
// never reaches NOSPACE however fast they are overwritten.
func (q StorageQuota) historyCompactionBytes() (start, target int64) {
	return q.limit() / 4, q.limit() / 8
}

// storageBytes is what the node holds, by part.
type storageBytes struct {
	statemachine.Usage
	Watch, Log int64
	NoSpace    bool // a NOSPACE alarm is raised
	Raised     bool // this node's NOSPACE alarm is raised
}

func (b storageBytes) total() int64 { return b.Usage.Total() + b.Watch + b.Log }

// storage reads what the node holds now.
func (s *Server) storage() storageBytes {
	var b storageBytes
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		b.Usage, b.NoSpace = m.Usage(), m.NoSpace()
		for _, a := range m.Alarms() {
			b.Raised = b.Raised || a == statemachine.AlarmMember{Member: s.node.ID(), Alarm: statemachine.AlarmNoSpace}
		}
		return nil
	})
	b.Watch, b.Log = s.hub.Bytes(), s.node.LogMemoryBytes()
	return b
}

// spaceState is the server's part of the quota.
type spaceState struct {
	// raising is set while a proposal of this node's NOSPACE alarm is in
	// flight, so that a burst of writes past the quota proposes it once.
	raising atomic.Bool
}

// checkStorageQuota refuses cmd when it adds data and a NOSPACE alarm is
// raised or this node holds its quota; in the second case it raises the
// alarm first, as etcd's quota check does before it answers NOSPACE. The
// state machine refuses such commands at apply too, while the alarm is
// raised: this check is what raises it, and what names the quota.
func (s *Server) checkStorageQuota(ctx context.Context, cmd statemachine.Command) error {
	limit := s.cfg.Quota.limit()
	if limit == 0 || !statemachine.AddsData(cmd) {
		return nil
	}
	b := s.storage()
	if b.NoSpace {
		return s.noSpaceError(b, limit)
	}
	if b.total() < limit {
		return nil
	}
	s.raiseNoSpace(ctx, b, limit)
	return s.noSpaceError(b, limit)
}

func (s *Server) noSpaceError(b storageBytes, limit int64) error {
	return fmt.Errorf("%w: NOSPACE alarm raised; node %s holds %s of its %s quota (--quota-backend-bytes): keys %s, history %s, sessions and leases %s, watch history %s, log %s; delete keys and compact, then disarm the alarm (etcdctl alarm disarm)",
		statemachine.ErrNoSpace, s.node.ID(), mib(b.total()), mib(limit), mib(b.Keys), mib(b.History), mib(b.Sessions+b.Leases), mib(b.Watch), mib(b.Log))
}

// raiseNoSpace proposes this node's NOSPACE alarm, unless it is raised
// or being raised.
func (s *Server) raiseNoSpace(ctx context.Context, b storageBytes, limit int64) {
	if b.Raised || !s.space.raising.CompareAndSwap(false, true) {
		return
	}
	defer s.space.raising.Store(false)
	_, err := s.node.Propose(ctx, statemachine.SetAlarm{Member: s.node.ID(), Alarm: statemachine.AlarmNoSpace, Active: true})
	if err != nil {
		s.log.Warn("the NOSPACE alarm could not be raised; the next write past the quota tries again", "err", err)
		return
	}
	s.log.Warn("raised the NOSPACE alarm: writes that add data are refused until an operator disarms it",
		"held", b.total(), "quota", limit, "keys", b.Keys, "history", b.History, "sessions", b.Sessions, "leases", b.Leases, "watch", b.Watch, "log", b.Log)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// storageLoop, on the leader, compacts the keys' history by bytes and
// raises the NOSPACE alarm when the node holds its quota with no write
// coming to raise it.
func (s *Server) storageLoop() {
	q := s.cfg.Quota
	limit := q.limit()
	if limit == 0 {
		return
	}
	tick := time.NewTicker(cmpOr(q.Interval, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-s.stopC:
			return
		case <-tick.C:
		}
		if !s.leading.Load() {
			continue
		}
		s.compactByBytes(q)
		if b := s.storage(); !b.NoSpace && b.total() >= limit {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.raiseNoSpace(ctx, b, limit)
			cancel()
		}
	}
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Alarms lists the alarms raised through the log, by etcd member ID:
// any member's NOSPACE over its quota. A full disk's NOSPACE is this
// node's own (NodeInfo.NoSpace) and is not among them.
func (b etcdBackend) Alarms(ctx context.Context) ([]*pb.AlarmMember, error) {
	var alarms []statemachine.AlarmMember
	err := b.s.node.ReadLocal(func(m *statemachine.Machine) error {
		alarms = m.Alarms()
		return nil
	})
	if err != nil {
		return nil, nodeError(err)
	}
	out := make([]*pb.AlarmMember, 0, len(alarms))
	for _, a := range alarms {
		out = append(out, &pb.AlarmMember{MemberID: memberID(a.Member), Alarm: pb.AlarmType(a.Alarm)})
	}
	return out, nil
}

// errNoAlarm is returned by Disarm for an alarm that is not raised.
var errNoAlarm = errors.New("no such alarm")

// Disarm clears member's alarm through the log, as etcd's DEACTIVATE
// does: at once, whatever the node holds. A node still over its quota
// raises it again at the next write that adds data.
func (b etcdBackend) Disarm(ctx context.Context, member uint64, alarm pb.AlarmType) error {
	var found *statemachine.AlarmMember
	err := b.s.node.ReadLocal(func(m *statemachine.Machine) error {
		for _, a := range m.Alarms() {
			if memberID(a.Member) == member && pb.AlarmType(a.Alarm) == alarm {
				found = &a
			}
		}
		return nil
	})
	if err != nil {
		return nodeError(err)
	}
	if found == nil {
		return errNoAlarm
	}
	_, err = b.Propose(ctx, statemachine.SetAlarm{Member: found.Member, Alarm: found.Alarm})
	if err == nil {
		b.s.log.Info("disarmed the alarm", "member", found.Member, "alarm", found.Alarm.String())
	}
	return err
}

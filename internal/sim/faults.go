package sim

// Fault injection. Each kind of fault is its own stream of events with
// exponential gaps (Faults gives the means), drawn from the run's one
// random source, so the same seed injects the same faults at the same
// instants. Faults stop when Duration ends; heal then undoes what lasts
// (partitions, pauses, crashed nodes) so that the final checks see the
// cluster as it recovers.

import (
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

func (s *Sim) scheduleFaults() {
	f := s.opts.Faults
	s.every(f.Partition, s.partition)
	s.every(f.Crash, func() {
		if n := s.pickNode(true); n != nil {
			s.stats.Faults["crash"]++
			n.crash()
			s.restartLater(n)
		}
	})
	s.every(f.Pause, func() {
		if n := s.pickNode(true); n != nil {
			d := int64(300*time.Millisecond) + s.randDur(3*time.Second)
			s.stats.Faults["pause"]++
			n.pausedUntil = s.now + d
			s.tracef(n.id, "pauses for %s", time.Duration(d))
		}
	})
	s.every(f.ClockJump, func() {
		if n := s.pickNode(true); n != nil {
			d := s.randDur(2*time.Minute) - int64(time.Minute)
			s.stats.Faults["clock jump"]++
			n.clockOffset += d
			s.tracef(n.id, "wall clock jumps by %s", time.Duration(d))
		}
	})
	s.every(f.FsyncError, func() {
		if n := s.pickNode(true); n != nil {
			s.stats.Faults["fsync error"]++
			n.disk.failSync = true
		}
	})
	s.every(f.Damage, s.damage)
	s.every(f.WatchCut, s.cutWatch)
	s.every(s.opts.Membership, s.membership)
}

// every runs fn at exponential intervals of mean d until Duration.
func (s *Sim) every(d time.Duration, fn func()) {
	if d <= 0 {
		return
	}
	var loop func()
	loop = func() {
		if s.stopping() {
			return
		}
		fn()
		s.after(s.expDur(d), loop)
	}
	s.after(s.expDur(d), loop)
}

// pickNode picks a node at random; with up, only a running one.
func (s *Sim) pickNode(up bool) *node {
	var c []*node
	for _, n := range s.nodes {
		if !up || n.up && n.failed == "" {
			c = append(c, n)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[s.rng.IntN(len(c))]
}

func (s *Sim) restartLater(n *node) {
	inc := n.incarnation
	s.after(int64(200*time.Millisecond)+s.randDur(3*time.Second), func() {
		if !n.up && n.incarnation == inc && n.refused == "" {
			n.boot()
		}
	})
}

// partition cuts links for a while: one node isolated, one node deaf
// (it sends but does not hear), or one link cut one way.
func (s *Sim) partition() {
	a := s.pickNode(false)
	var cut [][2]uint64
	kind := s.rng.IntN(3)
	for _, b := range s.nodes {
		if b == a {
			continue
		}
		switch kind {
		case 0: // isolated
			cut = append(cut, [2]uint64{a.id, b.id}, [2]uint64{b.id, a.id})
		case 1: // deaf
			cut = append(cut, [2]uint64{b.id, a.id})
		}
	}
	if kind == 2 {
		b := s.nodes[(int(a.id)+s.rng.IntN(len(s.nodes)-1))%len(s.nodes)]
		cut = append(cut, [2]uint64{a.id, b.id})
	}
	s.stats.Faults[[]string{"partition: isolate", "partition: one-way (deaf)", "partition: one link, one way"}[kind]]++
	for _, l := range cut {
		s.net.cut[l] = true
	}
	d := int64(500*time.Millisecond) + s.randDur(4*time.Second)
	s.tracef(0, "partition %v for %s", cut, time.Duration(d))
	s.after(d, func() {
		for _, l := range cut {
			delete(s.net.cut, l)
		}
		s.tracef(0, "partition %v heals", cut)
	})
}

// damage harms a synced write on a node's disk, a bit flip, a write
// the device lost or one it put in the wrong place, and crashes the node
// soon after, so that it meets the damage at restart (disk.go). A lost
// write is only done to one with a later write in its file: the loss of
// the newest synced batch leaves a log that reads as whole, and shorter,
// which no checksum can see (raftnode/walcheck.go afterLastBatch; a
// member is caught out by its leader's next heartbeat, loglost.go).
func (s *Sim) damage() {
	n := s.pickNode(true)
	if n == nil {
		return
	}
	d := n.disk
	all := d.synced()
	if len(all) < 2 {
		return
	}
	kind := s.rng.IntN(3)
	w := all[s.rng.IntN(len(all))]
	f, e := d.extent(w)
	switch kind {
	case 0:
		off := s.rng.Int64N(e.hi - e.lo)
		d.flip(w, off, s.rng.IntN(8))
		s.stats.Faults["bit flip"]++
		s.tracef(n.id, "disk: bit flip in %s at offset %d", w.path, e.lo+off)
	case 1:
		if w.i == len(f.extents)-1 {
			return
		}
		d.lose(w)
		s.stats.Faults["lost write"]++
		s.tracef(n.id, "disk: the synced write to %s at %d..%d was lost", w.path, e.lo, e.hi)
	default:
		if len(f.extents) < 2 {
			return
		}
		to := written{w.path, (w.i + 1 + s.rng.IntN(len(f.extents)-1)) % len(f.extents)}
		_, t := d.extent(to)
		d.misdirect(w, to)
		s.stats.Faults["misdirected write"]++
		s.tracef(n.id, "disk: the synced write to %s at %d..%d landed at %d", w.path, e.lo, e.hi, t.lo)
	}
	s.after(s.randDur(500*time.Millisecond), func() {
		if n.up {
			n.crash()
			s.restartLater(n)
		}
	})
}

// membership is the operator's next step with the spare node (the last
// one): add it as a learner, promote it once it has caught up, remove
// it, and, once its removal is applied on the leader, stop it and wipe
// its data before adding it again under the same ID, as
// docs/operations.md has an operator replace a node (raftnode derives a
// node's raft ID from its name, so a replacement reuses it). Changes are
// proposed on the leader as ConfChangeV2, as raftnode/membership.go
// proposes them, and applied by raft's ApplyConfChange at apply; a
// removed node keeps running until the operator stops it, as with
// raftnode.
func (s *Sim) membership() {
	var lead *node
	for _, n := range s.nodes {
		if n.up && n.failed == "" && n.role == etcdraft.StateLeader && !n.writing {
			lead = n
		}
	}
	// The operator waits for the last change to be applied on the leader
	// before the next, as raftnode's one-change-at-a-time rule has it.
	if lead == nil || lead.applied < lastIndex(lead.ms) {
		return
	}
	spare := s.nodes[len(s.nodes)-1]
	st := lead.rn.Status()
	_, voter := st.Config.Voters.IDs()[spare.id]
	_, learner := st.Config.Learners[spare.id]
	var cc raftpb.ConfChangeSingle
	switch {
	case learner:
		if pr, ok := st.Progress[spare.id]; !ok || pr.Match < st.Commit {
			return // not caught up yet
		}
		cc = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddNode, NodeID: spare.id}
	case voter:
		cc = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: spare.id}
	default:
		// Once removed, the node is stopped and wiped only a while
		// later: a heartbeat its leader sent before the removal, still
		// in flight, would otherwise reach the new, empty node and prove
		// to it that its log was lost (raftnode/loglost.go), stopping it.
		if s.spareGone == 0 {
			s.spareGone = s.now
		}
		if s.now-s.spareGone < int64(2*time.Second) {
			return
		}
		s.spareGone = 0
		if spare.up || spare.failed != "" || !spare.disk.empty() {
			s.tracef(spare.id, "operator stops the removed node and wipes its data")
			spare.crash()
			spare.failed, spare.refused = "", ""
			spare.disk = newDisk()
		}
		if spare.refused == "" {
			spare.incarnation++
			spare.boot()
		}
		cc = raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: spare.id}
	}
	if err := lead.rn.ProposeConfChange(raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{cc}}); err != nil {
		return
	}
	s.stats.Faults["membership: "+cc.Type.String()]++
	s.tracef(lead.id, "operator proposes %s %d", cc.Type, spare.id)
}

// heal ends every lasting fault and restarts crashed nodes.
func (s *Sim) heal() {
	s.healing = true
	s.net.cut = map[[2]uint64]bool{}
	s.tracef(0, "heal: faults off, partitions healed, crashed nodes restart")
	for _, n := range s.nodes {
		n.pausedUntil = 0
		n.disk.failSync = false
		// The spare, wiped, waits for the operator to add it again.
		if !n.up && n.refused == "" && (n.id <= uint64(s.opts.Nodes) || !n.disk.empty()) {
			n.incarnation++
			n.boot()
		}
	}
}

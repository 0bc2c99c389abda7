package sim

// The simulated network between nodes: every message is delayed by a
// draw, so two messages may overtake each other; some are lost, some
// delivered twice; a partition cuts a set of directed links, so a one-way
// partition (n1 hears n2, n2 does not hear n1) is a partition too.
// Client traffic crosses the same delays and losses but no partitions:
// clients stand for a load balancer that can reach every node.

import (
	"time"

	etcdraft "go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

type network struct {
	s   *Sim
	cut map[[2]uint64]bool // from, to: messages on this link are dropped
}

func newNetwork(s *Sim) network { return network{s: s, cut: map[[2]uint64]bool{}} }

// baseDelay is what every message takes at least, a LAN round trip's half.
const baseDelay = int64(200 * time.Microsecond)

func (nw *network) delay() int64 { return baseDelay + nw.s.randDur(nw.s.opts.Faults.MaxDelay) }

// send puts raft messages on the wire. A snapshot's fate is reported to
// the sender's raft at once, as raftnode's transport reports it once the
// stream is written.
func (nw *network) send(from *node, msgs []raftpb.Message) {
	s := nw.s
	for _, m := range msgs {
		lost := !s.healing && (nw.cut[[2]uint64{m.From, m.To}] || s.rng.Float64() < s.opts.Faults.Loss)
		if m.Type == raftpb.MsgSnap {
			st := etcdraft.SnapshotFinish
			if lost {
				st = etcdraft.SnapshotFailure
			}
			from.rn.ReportSnapshot(m.To, st)
		}
		if lost {
			continue
		}
		copies := 1
		if !s.healing && s.rng.Float64() < s.opts.Faults.Duplicate {
			copies = 2
		}
		for range copies {
			to := s.nodes[m.To-1]
			s.after(nw.delay(), func() { to.receive(m) })
		}
	}
}

// toClient and toNode carry client traffic: delayed and sometimes lost,
// never partitioned.
func (nw *network) toNode(n *node, fn func()) {
	if !nw.s.healing && nw.s.rng.Float64() < nw.s.opts.Faults.Loss {
		return
	}
	nw.s.after(nw.delay(), fn)
}

func (nw *network) toClient(fn func()) {
	if !nw.s.healing && nw.s.rng.Float64() < nw.s.opts.Faults.Loss {
		return
	}
	nw.s.after(nw.delay(), fn)
}

package sim

import (
	"cmp"
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Options configure one run. The zero value of every field but Seed
// takes a default (Defaults).
type Options struct {
	Seed  uint64
	Nodes int // voters at bootstrap; default 3
	// Watchers is how many watch clients run (watch.go); default 3.
	Watchers int
	// Membership, when set, adds one more node that is not in the first
	// configuration, and an operator that cycles it through the cluster:
	// added as a learner, promoted to voter, removed, its data wiped,
	// added again.
	Membership time.Duration
	// Duration is simulated time with faults and clients running; a heal
	// phase (HealFor) follows with faults off, then the final checks.
	Duration time.Duration
	HealFor  time.Duration
	Faults   Faults
	Bugs     Bugs
	// SnapshotEvery is how many applied entries a node lets pass between
	// snapshots; 0: never snapshot.
	SnapshotEvery uint64
	// TraceTail is how many trace lines a failure prints.
	TraceTail int
}

// Faults are the rates of the faults the scheduler injects. Rates per
// message are probabilities; the others are mean intervals between
// injections across the cluster (0: never).
type Faults struct {
	Loss, Duplicate float64       // per message
	MaxDelay        time.Duration // a message is delayed uniformly up to this (reordering)
	Partition       time.Duration // a partition (some one-way) begins
	Crash           time.Duration // a node crashes, to restart later
	Pause           time.Duration // a node pauses (a long GC, a frozen VM)
	ClockJump       time.Duration // a node's wall clock jumps
	FsyncError      time.Duration // a node's next sync fails
	Damage          time.Duration // a synced write of a node is damaged (bit flip, lost or misdirected write), and the node crashes soon after
	MaxDiskLatency  time.Duration // a sync takes uniformly up to this
	WatchCut        time.Duration // a watch client is cut off from its node for a while
	// CrashAfterVote is the chance that a node crashes right after it
	// sends a granted vote, to restart soon: the moment at which a vote
	// that was not durable would be forgotten.
	CrashAfterVote float64
}

// DefaultFaults is the mix the CI run and the long mode use.
var DefaultFaults = Faults{
	Loss: 0.02, Duplicate: 0.01, MaxDelay: 30 * time.Millisecond,
	Partition: 6 * time.Second, Crash: 5 * time.Second, Pause: 9 * time.Second,
	ClockJump: 10 * time.Second, FsyncError: 7 * time.Second, Damage: 20 * time.Second,
	MaxDiskLatency: 8 * time.Millisecond, CrashAfterVote: 0.02, WatchCut: 5 * time.Second,
}

// Bugs are deliberately wrong builds, each a test-only knob that breaks
// one rule the real code keeps, so that a test can show the simulator
// catching it (bugs_test.go). All false in every real run.
type Bugs struct {
	AckBeforeSync    bool // send votes and append acks before the write is durable
	ForgetVote       bool // the vote is never written durably
	VoteIgnoresLog   bool // grant votes whatever the candidate's log
	SkipCatchUp      bool // a member that cut damage votes at once (no catch-up rule)
	ApplyOutOfOrder  bool // node 1 applies the first two entries of a batch swapped
	EarlyExpiry      bool // the lessor is told a quarter of each session's TTL (server.go), so it expires a session TTL/4 after its heartbeat
	TokenFromSession bool // the server answers an acquire with the session ID as token
	StaleRead        bool // any node answers reads from its own state, no ReadIndex
	AckOnPropose     bool // the leader acknowledges a Put when it proposes it
	TrustPastTTL     bool // a client trusts its grant until two TTLs after its heartbeat, not 0.75 TTL
	NoLeaderLease    bool // the lessor answers heartbeats whenever raft says the node leads: no leader lease (raftnode/lease.go), no stall guard (lessor/stall.go)
	// WatchResumeAtLast: a watch client resumes from the last revision it
	// received, not the one after; WatchResumePastNext: from the one
	// after that.
	WatchResumeAtLast   bool
	WatchResumePastNext bool
}

// Defaults fills in zero fields.
func (o Options) Defaults() Options {
	o.Nodes = cmp.Or(o.Nodes, 3)
	o.Watchers = cmp.Or(o.Watchers, 3)
	o.Duration = cmp.Or(o.Duration, 30*time.Second)
	o.HealFor = cmp.Or(o.HealFor, 15*time.Second)
	o.TraceTail = cmp.Or(o.TraceTail, 60)
	return o
}

// The timing raftnode uses: a tick is a tenth of the election timeout
// (raftnode/engine.go electionTicks, Config.ElectionTimeout default 1s).
const (
	tickInterval    = 100 * time.Millisecond
	electionTimeout = 10 * tickInterval
)

// event is one thing the scheduler runs at a simulated instant.
type event struct {
	at  int64
	seq uint64
	run func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Sim is one run: the cluster, its clients, the network and the
// scheduler. It is not safe for concurrent use; nothing in it runs on
// another goroutine.
type Sim struct {
	opts  Options
	rng   *rand.Rand
	now   int64 // simulated nanoseconds since the start
	queue eventQueue
	seq   uint64

	nodes    []*node
	clients  []*client
	watchers []*watchClient
	streams  []*stream           // open watch streams, in the order they opened
	hubs     map[uint64]*nodeHub // each node's watch hub
	net      network
	check    *checker
	trace    *trace

	healing bool
	stats   Stats

	spareGone int64 // when the operator first saw the spare out of the configuration; 0: not

}

// Stats count what a run did.
type Stats struct {
	Steps    int
	Faults   map[string]int
	Checks   map[string]int
	Ops      int // client operations completed (acknowledged or failed)
	Unknown  int // client operations whose outcome stayed unknown
	Leaders  int // elections won
	Applied  uint64
	Refused  int // nodes that refused to start on a damaged log
	Failed   int // nodes that stopped on a lost log (raftnode/loglost.go)
	CaughtUp int // members that caught up past a damaged log
	Snaps    int // snapshots taken
	Restores int // snapshots restored (at start, or sent by a leader)

	WatchEvents    int // events watch clients received
	WatchResumes   int // watches resumed on another node
	WatchCompacted int // watches refused as compacted, started again from a fresh read
	Compactions    int // compactions the leader proposed
}

func (s *Stats) add(o Stats) {
	s.Steps += o.Steps
	s.Ops += o.Ops
	s.Unknown += o.Unknown
	s.Leaders += o.Leaders
	s.Applied += o.Applied
	s.Refused += o.Refused
	s.Failed += o.Failed
	s.CaughtUp += o.CaughtUp
	s.Snaps += o.Snaps
	s.Restores += o.Restores
	s.WatchEvents += o.WatchEvents
	s.WatchResumes += o.WatchResumes
	s.WatchCompacted += o.WatchCompacted
	s.Compactions += o.Compactions
	for k, v := range o.Faults {
		s.Faults[k] += v
	}
	for k, v := range o.Checks {
		s.Checks[k] += v
	}
}

func newStats() Stats { return Stats{Faults: map[string]int{}, Checks: map[string]int{}} }

// Violation is an invariant the run broke.
type Violation struct {
	Invariant string
	Detail    string
	At        int64
}

func (v *Violation) Error() string {
	return fmt.Sprintf("invariant %q broken at t=%s: %s", v.Invariant, fmtTime(v.At), v.Detail)
}

// Result is what Run reports.
type Result struct {
	Seed      uint64
	TraceHash uint64
	Stats     Stats
	Violation *Violation // nil: every invariant held
	Tail      []string   // the trace's last lines
}

// Run runs one seed to completion or to its first violation.
func Run(opts Options) (res Result) {
	opts = opts.Defaults()
	s := &Sim{
		opts:  opts,
		rng:   rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		trace: newTrace(opts.TraceTail),
		stats: newStats(),
		hubs:  map[uint64]*nodeHub{},
	}
	s.check = newChecker(s)
	s.net = newNetwork(s)
	res.Seed = opts.Seed
	defer seedCryptoRand(opts.Seed)()
	defer func() {
		if r := recover(); r != nil {
			v, ok := r.(*Violation)
			if !ok {
				v = &Violation{Invariant: "no panic", Detail: fmt.Sprint(r), At: s.now}
			}
			res.Violation = v
		}
		// A node still up holds raft-wal's goroutine, and with it its
		// segment buffers: left open, each run kept about 3 MB alive,
		// and a long run of the simulator was killed for memory after
		// some 4,000 seeds (12 and 24 GB).
		for _, n := range s.nodes {
			if n.store != nil {
				_ = n.store.Close()
				n.store = nil
			}
		}
		res.TraceHash = s.trace.hash
		res.Stats = s.stats
		res.Tail = s.trace.tail()
	}()
	s.start()
	end := int64(opts.Duration)
	s.runUntil(end)
	s.heal()
	s.runUntil(end + int64(opts.HealFor))
	s.check.final()
	return res
}

// fail stops the run with a violation.
func (s *Sim) fail(invariant, format string, args ...any) {
	v := &Violation{Invariant: invariant, Detail: fmt.Sprintf(format, args...), At: s.now}
	s.tracef(0, "VIOLATION %s: %s", invariant, v.Detail)
	panic(v)
}

// after schedules fn to run d nanoseconds from now; events at the same
// instant run in the order they were scheduled.
func (s *Sim) after(d int64, fn func()) {
	s.seq++
	heap.Push(&s.queue, &event{at: s.now + max(d, 0), seq: s.seq, run: fn})
}

func (s *Sim) runUntil(end int64) {
	for s.queue.Len() > 0 && s.queue[0].at <= end {
		e := heap.Pop(&s.queue).(*event)
		s.now = e.at
		e.run()
		for _, n := range s.nodes {
			n.process()
		}
		s.pumpWatches()
		s.stats.Steps++
		s.check.step()
	}
	s.now = end
}

func (s *Sim) start() {
	spare := 0
	if s.opts.Membership > 0 {
		spare = 1
	}
	for i := range s.opts.Nodes + spare {
		n := newNode(s, uint64(i+1))
		s.nodes = append(s.nodes, n)
		if i < s.opts.Nodes {
			n.boot()
		}
	}
	s.startClients()
	s.startWatches()
	s.scheduleFaults()
}

// randDur is uniform in [0, d).
func (s *Sim) randDur(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return s.rng.Int64N(int64(d))
}

// expDur is exponential with mean d: the gap between independent faults.
func (s *Sim) expDur(d time.Duration) int64 { return int64(s.rng.ExpFloat64() * float64(d)) }

func (s *Sim) tracef(node uint64, format string, args ...any) {
	s.trace.add(s.now, node, fmt.Sprintf(format, args...))
}

func fmtTime(t int64) string { return fmt.Sprintf("%.6fs", float64(t)/1e9) }

// trace keeps a hash of every line and the last few lines.
type trace struct {
	hash uint64
	ring []string
	next int
	full bool
}

func newTrace(n int) *trace { return &trace{hash: 14695981039346656037, ring: make([]string, n)} }

func (t *trace) add(at int64, node uint64, line string) {
	who := "sim"
	if node > 0 {
		who = fmt.Sprintf("n%d", node)
	}
	l := fmt.Sprintf("%s %-3s %s", fmtTime(at), who, line)
	for i := 0; i < len(l); i++ {
		t.hash ^= uint64(l[i])
		t.hash *= 1099511628211
	}
	t.hash ^= '\n'
	t.hash *= 1099511628211
	t.ring[t.next] = l
	t.next = (t.next + 1) % len(t.ring)
	if t.next == 0 {
		t.full = true
	}
}

func (t *trace) tail() []string {
	if !t.full {
		return slices.Clone(t.ring[:t.next])
	}
	return append(slices.Clone(t.ring[t.next:]), t.ring[:t.next]...)
}

// msgString is a raft message for the trace.
func msgString(m raftpb.Message) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %d->%d t%d", strings.TrimPrefix(m.Type.String(), "Msg"), m.From, m.To, m.Term)
	switch m.Type {
	case raftpb.MsgApp:
		fmt.Fprintf(&b, " idx%d/t%d +%d c%d", m.Index, m.LogTerm, len(m.Entries), m.Commit)
	case raftpb.MsgAppResp:
		fmt.Fprintf(&b, " idx%d rej=%v", m.Index, m.Reject)
	case raftpb.MsgVote, raftpb.MsgPreVote:
		fmt.Fprintf(&b, " last%d/t%d", m.Index, m.LogTerm)
	case raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
		fmt.Fprintf(&b, " rej=%v", m.Reject)
	case raftpb.MsgHeartbeat:
		fmt.Fprintf(&b, " c%d", m.Commit)
	case raftpb.MsgSnap:
		fmt.Fprintf(&b, " snap%d", m.Snapshot.Metadata.Index)
	}
	return b.String()
}

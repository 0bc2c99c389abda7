package lessor

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurehq/tenure/statemachine"
)

// Errors returned by Heartbeat. Callers branch with errors.Is.
var (
	// ErrNotLeader is returned when this node is not the leader, or has not
	// yet been promoted: only the leader times sessions, so the client must
	// send its heartbeats there.
	ErrNotLeader = errors.New("not leader")
	// ErrSessionExpired is returned when the leader does not know the
	// session or its deadline has already passed. An expiry is then under
	// way, and a late heartbeat never revives the session: the client may
	// already have stopped trusting its grants.
	ErrSessionExpired = errors.New("session expired")
)

// Proposer is how the lessor started by New asks the replicated log to
// expire things. Propose proposes one command the lessor built
// (Lessor.Command: an ExpireSessions, ExpireKeys, EndLockDelays or
// CollectLeases carrying the lessor's epoch) and returns once it has been
// applied, or with an error; a failed call may still have been
// committed. It may return ErrPostponed for a command it cannot make yet.
// The lessor calls it at most once at a time, from its own goroutine, and
// cancels ctx when it is demoted or stopped. A driven lessor (NewDriven)
// has no Proposer: its caller proposes Command of what Due returns.
type Proposer interface {
	Propose(ctx context.Context, cmd statemachine.Command) error
}

// ErrPostponed is what a Proposer returns for a proposal it cannot make
// yet (the cluster runs a version without it): the lessor retries after
// PostponeInterval without logging a failure.
var ErrPostponed = errors.New("postponed")

// Config configures a Lessor. Only Proposer is required, and only by New.
type Config struct {
	Proposer Proposer     // ignored by NewDriven
	Logger   *slog.Logger // default: discard
	// Now returns the current time. The times must carry a monotonic
	// reading, as time.Now's do, so that a step of the wall clock never
	// moves a deadline. Default time.Now.
	Now func() time.Time
	// Leased reports whether, at now, this node leads under a lease a
	// quorum confirmed, so that no other leader can have been elected
	// (raftnode.Node.LeaseHeld). Heartbeats are refused while it does
	// not. Default: always, for a lessor with no raft beneath it.
	Leased func(now time.Time) bool
	// Registerer receives the tenure_lessor_ metrics; nil registers none.
	Registerer prometheus.Registerer
	// RetryInterval is how long a failed expiry waits before it is
	// proposed again. Default 500ms.
	RetryInterval time.Duration
	// PostponeInterval is how long a postponed one waits. Default 1m.
	PostponeInterval time.Duration
}

const (
	// shardCount spreads sessions over that many mutexes, so that
	// heartbeats on different sessions rarely wait for each other.
	shardCount = 32
	// maxBatch bounds the items of one kind in one proposal: 100,000
	// sessions expiring together become 100 commands of modest size, not
	// one entry the size of a snapshot.
	maxBatch = 1000
	// maxExamine bounds the heap items the loop looks at while holding mu,
	// so that Observe, on the state machine's goroutine, never waits long.
	maxExamine = 4 * maxBatch
	// compactMin is the least number of stale heap items worth a rebuild.
	compactMin = 1024
)

// Lessor is the leader's keeper of deadlines: sessions, keys with a TTL of
// their own, lock-delays, and idle leases waiting to be collected. It decides when something has expired and
// proposes the expiry; the state machine removes it and emits the events
// that make the lessor forget it. The caller must call Stop when finished.
type Lessor struct {
	logger   *slog.Logger
	now      func() time.Time
	leased   func(time.Time) bool
	retry    time.Duration
	postpone time.Duration
	metrics  metrics

	shards [shardCount]shard

	// mu guards the fields below and the removed flags of all entries.
	// Lock order: mu, then a shard's mu.
	mu      sync.Mutex
	leader  bool
	stopped bool
	// term counts leaderships. A proposal made in an earlier term must not
	// put its items back: they belong to a leadership that is over.
	term     uint64
	epoch    int64
	ctx      context.Context // cancelled when this term ends
	cancel   context.CancelFunc
	sessions int // tracked sessions, for the gauge and for compaction
	keys     map[string]*keyEntry
	delays   map[statemachine.LeaseID]*delayEntry
	idle     map[statemachine.LeaseID]*idleEntry
	heap     deadlineHeap

	// wake asks for Due to be called again: a new earliest deadline, a
	// new term, or a heap to compact. It is called with mu held.
	wake     func()
	stopC    chan struct{}  // closed by Stop: the goroutines of New return
	running  sync.WaitGroup // the goroutines of New
	stopOnce sync.Once

	// base is the reading instants count from (heap.go); the pulse
	// (stall.go) keeps instants too.
	base       time.Time
	pulseAt    atomic.Int64 // when the node last ran, as far as the lessor saw
	stallLimit atomic.Int64 // the longest gap that is not a stop; 0: no guard
	holdUntil  atomic.Int64 // expiries are held back until then
}

// New returns a Lessor that is not yet leader, with its two goroutines
// running: the expiry loop (expiry.go), which proposes through
// cfg.Proposer, and the pulse (stall.go). The caller should call Stop when
// finished.
func New(cfg Config) *Lessor {
	kickC := make(chan struct{}, 1)
	l := newLessor(cfg, func() {
		// One pending wake is enough: the loop looks at the whole heap
		// when it wakes.
		select {
		case kickC <- struct{}{}:
		default:
		}
	})
	l.running.Add(2)
	go l.run(cfg.Proposer, kickC)
	go l.beat()
	return l
}

// NewDriven returns a Lessor that is not yet leader and starts no
// goroutine: its caller drives it (doc.go, "Caller's duties"), calling Due
// when the wait it returned has passed or when wake is called, proposing
// what Due returns, reporting each outcome with Proposed, and calling
// Pulse as the pulse goroutine would. wake is called with the lessor's
// lock held, so it must not call the lessor: it should only arrange for
// Due to be called soon. cfg.Proposer is ignored.
func NewDriven(cfg Config, wake func()) *Lessor {
	return newLessor(cfg, wake)
}

// newLessor is the part of New and NewDriven that starts nothing.
func newLessor(cfg Config, wake func()) *Lessor {
	l := &Lessor{
		logger:   cfg.Logger,
		now:      cfg.Now,
		leased:   cfg.Leased,
		retry:    cfg.RetryInterval,
		postpone: cfg.PostponeInterval,
		wake:     wake,
		stopC:    make(chan struct{}),
	}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.leased == nil {
		l.leased = func(time.Time) bool { return true }
	}
	if l.retry <= 0 {
		l.retry = 500 * time.Millisecond
	}
	if l.postpone <= 0 {
		l.postpone = time.Minute
	}
	l.metrics = newMetrics(l)
	if cfg.Registerer != nil {
		if err := l.metrics.register(cfg.Registerer); err != nil {
			l.logger.Warn("lessor: registering metrics", "err", err)
		}
	}
	l.base = l.now()
	return l
}

// Stop forgets everything, stops the goroutines of New and waits for
// them, cancelling any proposal in flight. Safe to call more than once; a
// later Promote is ignored.
func (l *Lessor) Stop() {
	l.stopOnce.Do(func() {
		l.mu.Lock()
		l.stopped = true
		l.resetLocked()
		l.mu.Unlock()
		close(l.stopC)
	})
	l.running.Wait()
}

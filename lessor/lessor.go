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

// Proposer is how the lessor asks the replicated log to expire things.
// Each method proposes one command carrying epoch and returns once the
// command has been applied, or with an error; a failed call may still have
// been committed. The lessor calls at most one method at a time, from its
// own goroutine, and cancels ctx when it is demoted or stopped.
type Proposer interface {
	ExpireSessions(ctx context.Context, epoch int64, ids []int64) error
	ExpireKeys(ctx context.Context, epoch int64, keys []statemachine.KeyTTL) error
	EndLockDelays(ctx context.Context, epoch int64, delays []statemachine.LockDelay) error
	// CollectLeases deletes leases that stayed idle for their gc_after.
	// It may return ErrPostponed: the lessor then asks again later,
	// quietly.
	CollectLeases(ctx context.Context, epoch int64, leases []statemachine.IdleLease) error
}

// ErrPostponed is what a Proposer returns for a proposal it cannot make
// yet (the cluster runs a version without it): the lessor retries after
// PostponeInterval without logging a failure.
var ErrPostponed = errors.New("postponed")

// Config configures a Lessor. Only Proposer is required.
type Config struct {
	Proposer Proposer
	Logger   *slog.Logger // default: discard
	// Now returns the current time. The times must carry a monotonic
	// reading, as time.Now's do, so that a step of the wall clock never
	// moves a deadline. Default time.Now.
	Now func() time.Time
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
	proposer Proposer
	logger   *slog.Logger
	now      func() time.Time
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

	kickC    chan struct{} // wakes the loop: a new earliest deadline, or a heap to compact
	stopC    chan struct{}
	doneC    chan struct{}
	beatDone chan struct{} // closed when the pulse (stall.go) has stopped
	stopOnce sync.Once

	// The pulse (stall.go), in nanoseconds since base by l.now.
	base        time.Time
	pulseAt     atomic.Int64 // when the node last ran, as far as the lessor saw
	stallLimit  atomic.Int64 // the longest gap that is not a stop; 0: no guard
	refuseUntil atomic.Int64 // heartbeats are refused until then
}

// New returns a Lessor that is not yet leader, with its expiry loop
// running. The caller should call Stop when finished.
func New(cfg Config) *Lessor {
	l := &Lessor{
		proposer: cfg.Proposer,
		logger:   cfg.Logger,
		now:      cfg.Now,
		retry:    cfg.RetryInterval,
		postpone: cfg.PostponeInterval,
		kickC:    make(chan struct{}, 1),
		stopC:    make(chan struct{}),
		doneC:    make(chan struct{}),
		beatDone: make(chan struct{}),
	}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	if l.now == nil {
		l.now = time.Now
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
	go l.run()
	go l.beat()
	return l
}

// Stop forgets everything, stops the loop and waits for it, cancelling any
// proposal in flight. Safe to call more than once; a later Promote is
// ignored.
func (l *Lessor) Stop() {
	l.stopOnce.Do(func() {
		l.mu.Lock()
		l.stopped = true
		l.resetLocked()
		l.mu.Unlock()
		close(l.stopC)
	})
	<-l.doneC
	<-l.beatDone
}

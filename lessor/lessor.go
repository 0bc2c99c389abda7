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
}

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

// A session's deadline moves only under its shard's mutex, which keeps
// Heartbeat off the heap and off Lessor.mu.
type session struct {
	id  int64
	ttl time.Duration

	// guarded by the shard's mu
	deadline time.Time
	renewed  time.Time // zero until this leader hears from the session
	expiring bool

	removed bool // guarded by Lessor.mu; set when forgotten, making its heap item stale
}

type keyEntry struct {
	kt       statemachine.KeyTTL
	deadline time.Time
	removed  bool // guarded by Lessor.mu
}

type delayEntry struct {
	ld       statemachine.LockDelay
	deadline time.Time
	removed  bool // guarded by Lessor.mu
}

type shard struct {
	mu     sync.Mutex // guards active, m, and the deadline, renewed and expiring of m's sessions
	active bool       // this node is leader; Heartbeat reads it without touching Lessor.mu
	m      map[int64]*session
	beats  atomic.Uint64
	_      [96]byte // keeps neighbouring shards' mutexes off one cache line
}

// Lessor is the leader's keeper of deadlines: sessions, keys with a TTL of
// their own, and lock-delays. It decides when something has expired and
// proposes the expiry; the state machine removes it and emits the events
// that make the lessor forget it. The caller must call Stop when finished.
type Lessor struct {
	proposer Proposer
	logger   *slog.Logger
	now      func() time.Time
	retry    time.Duration
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
	heap     deadlineHeap

	kickC    chan struct{} // wakes the loop: a new earliest deadline, or a heap to compact
	stopC    chan struct{}
	doneC    chan struct{}
	stopOnce sync.Once
}

// New returns a Lessor that is not yet leader, with its expiry loop
// running. The caller should call Stop when finished.
func New(cfg Config) *Lessor {
	l := &Lessor{
		proposer: cfg.Proposer,
		logger:   cfg.Logger,
		now:      cfg.Now,
		retry:    cfg.RetryInterval,
		kickC:    make(chan struct{}, 1),
		stopC:    make(chan struct{}),
		doneC:    make(chan struct{}),
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
	l.metrics = newMetrics(l)
	if cfg.Registerer != nil {
		if err := l.metrics.register(cfg.Registerer); err != nil {
			l.logger.Warn("lessor: registering metrics", "err", err)
		}
	}
	go l.run()
	return l
}

func (l *Lessor) shard(id int64) *shard {
	// Session IDs are revisions, nearly consecutive; the multiply spreads
	// them anyway should the allocation ever change.
	return &l.shards[(uint64(id)*0x9E3779B97F4A7C15)>>59]
}

// Promote is called when this node has become leader, after a barrier and
// a NewEpoch entry, with the epoch that entry set and the deadlines read
// from the state with no command applied in between (hold the state lock
// across reading d and calling Promote, or events in the gap are lost).
//
// Every deadline is reset to now + its TTL or delay + extra, where extra
// is the election timeout: the old leader may have renewed a session just
// before it lost touch, so a failover may lengthen a lease but never
// shorten it. Promote replaces whatever was tracked and starts expiring.
func (l *Lessor) Promote(epoch int64, d statemachine.Deadlines, extra time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		l.logger.Warn("lessor: promote after stop ignored", "epoch", epoch)
		return
	}
	l.resetLocked()
	l.leader = true
	l.epoch = epoch
	l.ctx, l.cancel = context.WithCancel(context.Background())

	l.heap = make(deadlineHeap, 0, len(d.Sessions)+len(d.Keys)+len(d.Delays))
	var maps [shardCount]map[int64]*session
	for i := range maps {
		maps[i] = make(map[int64]*session, len(d.Sessions)/shardCount+1)
	}
	for _, st := range d.Sessions {
		ttl := time.Duration(st.TTL)
		s := &session{id: st.ID, ttl: ttl, deadline: now.Add(ttl + extra)}
		m := maps[(uint64(st.ID)*0x9E3779B97F4A7C15)>>59]
		if old := m[st.ID]; old != nil {
			old.removed = true
		} else {
			l.sessions++
		}
		m[st.ID] = s
		l.heap = append(l.heap, item{at: s.deadline, s: s})
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.m, sh.active = maps[i], true
		sh.mu.Unlock()
	}
	l.keys = make(map[string]*keyEntry, len(d.Keys))
	for _, kt := range d.Keys {
		k := &keyEntry{kt: kt, deadline: now.Add(time.Duration(kt.TTL) + extra)}
		l.keys[kt.Key] = k
		l.heap = append(l.heap, item{at: k.deadline, k: k})
	}
	l.delays = make(map[statemachine.LeaseID]*delayEntry, len(d.Delays))
	for _, ld := range d.Delays {
		e := &delayEntry{ld: ld, deadline: now.Add(time.Duration(ld.Delay) + extra)}
		l.delays[ld.Lease] = e
		l.heap = append(l.heap, item{at: e.deadline, d: e})
	}
	l.heap.init()
	l.metrics.sessions.Set(float64(l.sessions))
	l.logger.Info("lessor: promoted", "epoch", epoch, "sessions", l.sessions,
		"keys", len(l.keys), "lock_delays", len(l.delays), "extra", extra)
	l.kick()
}

// Demote is called when leadership is lost. It cancels any proposal in
// flight, stops expiring and forgets everything; heartbeats then get
// ErrNotLeader. The next leader re-reads the deadlines from the state.
func (l *Lessor) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leader {
		l.logger.Info("lessor: demoted", "epoch", l.epoch)
	}
	l.resetLocked()
}

// resetLocked ends the current term, if any. The heap and maps are
// dropped, not emptied, so that the loop's in-flight batch of the old term
// cannot reach the new one's items.
func (l *Lessor) resetLocked() {
	l.term++
	if l.cancel != nil {
		l.cancel()
	}
	l.ctx, l.cancel = nil, nil
	l.leader = false
	l.epoch = 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.m, sh.active = nil, false
		sh.mu.Unlock()
	}
	l.sessions = 0
	l.keys, l.delays, l.heap = nil, nil, nil
	l.metrics.sessions.Set(0)
	l.kick()
}

// Observe is called with each applied command's events, in log order, on
// the state machine's goroutine under the state write lock. It only
// updates maps and the heap under locks held briefly by others, and never
// proposes: a proposal from here would wait for the very apply that is
// calling it. Ignored when not leader.
func (l *Lessor) Observe(events []statemachine.Event) {
	if len(events) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return
	}
	// One reading for the whole command: its events happened together, and
	// sessions opened together then expire in one batch.
	now := l.now()
	sessions := l.sessions
	for i := range events {
		ev := &events[i]
		switch ev.Type {
		case statemachine.EventSessionOpened:
			if ev.Session == nil {
				continue
			}
			ttl := time.Duration(ev.Session.TTL)
			l.addSessionLocked(&session{id: ev.Session.ID, ttl: ttl, deadline: now.Add(ttl), renewed: now})
		case statemachine.EventSessionClosed, statemachine.EventSessionExpired:
			id := ev.SessionID
			if id == 0 && ev.Session != nil {
				id = ev.Session.ID
			}
			l.forgetSessionLocked(id)
		case statemachine.EventKeyPut:
			if ev.KV == nil {
				continue
			}
			l.forgetKeyLocked(ev.KV.Key)
			if ev.KV.TTL > 0 {
				kt := statemachine.KeyTTL{Key: ev.KV.Key, ModRevision: ev.KV.ModRevision, TTL: ev.KV.TTL}
				k := &keyEntry{kt: kt, deadline: now.Add(time.Duration(kt.TTL))}
				l.keys[kt.Key] = k
				l.pushLocked(item{at: k.deadline, k: k})
			}
		case statemachine.EventKeyDeleted, statemachine.EventKeyExpired:
			if kv := eventKey(ev); kv != nil {
				l.forgetKeyLocked(kv.Key)
			}
		case statemachine.EventLeaseExpired, statemachine.EventLeaseRevoked:
			if ev.LockDelay <= 0 {
				continue
			}
			l.forgetDelayLocked(ev.Lease)
			ld := statemachine.LockDelay{Lease: ev.Lease, Revision: ev.Revision, Delay: ev.LockDelay}
			e := &delayEntry{ld: ld, deadline: now.Add(time.Duration(ld.Delay))}
			l.delays[ld.Lease] = e
			l.pushLocked(item{at: e.deadline, d: e})
		case statemachine.EventLockDelayEnded:
			l.forgetDelayLocked(ev.Lease)
		}
	}
	if l.sessions != sessions {
		l.metrics.sessions.Set(float64(l.sessions))
	}
	if l.needsCompactLocked() {
		l.kick()
	}
}

func eventKey(ev *statemachine.Event) *statemachine.KeyValue {
	if ev.KV != nil {
		return ev.KV
	}
	return ev.PrevKV
}

func (l *Lessor) addSessionLocked(s *session) {
	sh := l.shard(s.id)
	sh.mu.Lock()
	old := sh.m[s.id]
	sh.m[s.id] = s
	sh.mu.Unlock()
	if old != nil {
		old.removed = true
	} else {
		l.sessions++
	}
	l.pushLocked(item{at: s.deadline, s: s})
}

func (l *Lessor) forgetSessionLocked(id int64) {
	sh := l.shard(id)
	sh.mu.Lock()
	s := sh.m[id]
	delete(sh.m, id)
	sh.mu.Unlock()
	if s != nil {
		s.removed = true
		l.sessions--
	}
}

func (l *Lessor) forgetKeyLocked(key string) {
	if k := l.keys[key]; k != nil {
		k.removed = true
		delete(l.keys, key)
	}
}

func (l *Lessor) forgetDelayLocked(id statemachine.LeaseID) {
	if e := l.delays[id]; e != nil {
		e.removed = true
		delete(l.delays, id)
	}
}

// pushLocked adds an item and wakes the loop if the item is now the
// earliest: the loop may be asleep until a later deadline.
func (l *Lessor) pushLocked(it item) {
	earliest := len(l.heap) == 0 || it.at.Before(l.heap[0].at)
	l.heap.push(it)
	if earliest {
		l.kick()
	}
}

func (l *Lessor) kick() {
	select {
	case l.kickC <- struct{}{}:
	default:
	}
}

// needsCompactLocked reports whether most of the heap is stale items of
// forgotten entries. Items are dropped lazily when they come due, but
// with long TTLs and many short-lived sessions they would pile up for a
// whole TTL.
func (l *Lessor) needsCompactLocked() bool {
	live := l.sessions + len(l.keys) + len(l.delays)
	return len(l.heap) > compactMin && len(l.heap) > 2*live
}

func (l *Lessor) compactLocked() {
	h := l.heap[:0]
	for _, it := range l.heap {
		if !it.stale() {
			h = append(h, it)
		}
	}
	clear(l.heap[len(h):])
	l.heap = h
	l.heap.init()
}

// Heartbeat renews a session on behalf of its client, on the API's
// goroutines, concurrently with everything else: deadline = now + TTL. It
// returns the session's TTL, ErrNotLeader when not leader (or not yet
// promoted), or ErrSessionExpired when the session is unknown or its
// deadline has already passed.
//
// Heartbeat touches one shard's map and nothing else, so that 100,000
// sessions can each beat several times per TTL. A deadline only ever moves
// later, so that a heartbeat right after Promote keeps the election
// timeout's grace rather than cutting it short.
func (l *Lessor) Heartbeat(id int64) (time.Duration, error) {
	now := l.now()
	sh := l.shard(id)
	sh.mu.Lock()
	if !sh.active {
		sh.mu.Unlock()
		return 0, ErrNotLeader
	}
	s := sh.m[id]
	if s == nil || s.expiring || !now.Before(s.deadline) {
		if s != nil {
			s.expiring = true
		}
		sh.mu.Unlock()
		return 0, ErrSessionExpired
	}
	if d := now.Add(s.ttl); s.deadline.Before(d) {
		s.deadline = d
	}
	s.renewed = now
	ttl := s.ttl
	sh.mu.Unlock()
	sh.beats.Add(1)
	return ttl, nil
}

// LastHeartbeat returns when this leader last renewed the session, for
// display; zero if unknown, or if the session has not beaten since this
// node became leader (the logged renew time is then the better answer).
// The monotonic reading is stripped: the time is only shown.
func (l *Lessor) LastHeartbeat(id int64) time.Time {
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s := sh.m[id]; s != nil {
		return s.renewed.Round(0)
	}
	return time.Time{}
}

// Remaining returns the time until the session's deadline on this leader,
// for display (EXPIRES-IN); zero once the deadline has passed, and false
// when the session is unknown or this node is not leader.
func (l *Lessor) Remaining(id int64) (time.Duration, bool) {
	now := l.now()
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.m[id]
	if s == nil {
		return 0, false
	}
	return max(s.deadline.Sub(now), 0), true
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
}

// batch is what the loop proposes in one round: due items of each kind,
// with the term they were collected in.
type batch struct {
	term     uint64
	epoch    int64
	ctx      context.Context
	sessions []*session
	keys     []*keyEntry
	delays   []*delayEntry
}

func (b *batch) len() int { return len(b.sessions) + len(b.keys) + len(b.delays) }

func (b *batch) full(it item) bool {
	switch {
	case it.s != nil:
		return len(b.sessions) >= maxBatch
	case it.k != nil:
		return len(b.keys) >= maxBatch
	default:
		return len(b.delays) >= maxBatch
	}
}

// run is the expiry loop: it sleeps until the earliest deadline, collects
// what is due and proposes it. It is the only goroutine the Lessor starts.
func (l *Lessor) run() {
	defer close(l.doneC)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-l.stopC:
			return
		default:
		}
		var b batch
		more, wait := l.collect(&b)
		if b.len() > 0 {
			l.propose(&b)
		}
		if more || b.len() > 0 {
			continue
		}
		var timerC <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			timerC = timer.C
		}
		select {
		case <-l.stopC:
			timer.Stop()
			return
		case <-l.kickC:
		case <-timerC:
		}
		timer.Stop()
	}
}

// collect pops due items into b, re-queueing those renewed since they were
// queued (the lazy re-check that keeps Heartbeat off the heap) and marking
// due sessions as expiring. more reports that due items remain; otherwise
// wait is the time to the next deadline, or negative when there is none.
func (l *Lessor) collect(b *batch) (more bool, wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leader {
		return false, -1
	}
	if l.needsCompactLocked() {
		l.compactLocked()
	}
	b.term, b.epoch, b.ctx = l.term, l.epoch, l.ctx
	now := l.now()
	for n := 0; len(l.heap) > 0; n++ {
		it := l.heap[0]
		if now.Before(it.at) {
			return false, it.at.Sub(now)
		}
		if n >= maxExamine || b.full(it) {
			return true, 0
		}
		l.heap.pop()
		if it.stale() {
			continue
		}
		switch {
		case it.s != nil:
			s := it.s
			sh := l.shard(s.id)
			sh.mu.Lock()
			deadline := s.deadline
			due := !now.Before(deadline)
			if due {
				s.expiring = true
			}
			sh.mu.Unlock()
			if due {
				b.sessions = append(b.sessions, s)
			} else {
				l.heap.push(item{at: deadline, s: s})
			}
		case it.k != nil:
			if now.Before(it.k.deadline) {
				l.heap.push(item{at: it.k.deadline, k: it.k})
			} else {
				b.keys = append(b.keys, it.k)
			}
		default:
			if now.Before(it.d.deadline) {
				l.heap.push(item{at: it.d.deadline, d: it.d})
			} else {
				b.delays = append(b.delays, it.d)
			}
		}
	}
	return false, -1
}

// propose sends one command per kind. Items stay marked until Observe sees
// the state machine remove them; a failed proposal puts them back on the
// heap to be proposed again after the retry interval. A successful one
// does not: the state machine has applied it, so anything it skipped was
// already gone or renewed by a newer write, and its event forgets the item.
func (l *Lessor) propose(b *batch) {
	if n := len(b.sessions); n > 0 {
		ids := make([]int64, n)
		for i, s := range b.sessions {
			ids[i] = s.id
		}
		err := l.proposer.ExpireSessions(b.ctx, b.epoch, ids)
		l.proposed(b, "session", n, err, func(at time.Time) {
			for _, s := range b.sessions {
				if !s.removed {
					l.heap.push(item{at: at, s: s})
				}
			}
		})
	}
	if n := len(b.keys); n > 0 {
		keys := make([]statemachine.KeyTTL, n)
		for i, k := range b.keys {
			keys[i] = k.kt
		}
		err := l.proposer.ExpireKeys(b.ctx, b.epoch, keys)
		l.proposed(b, "key", n, err, func(at time.Time) {
			for _, k := range b.keys {
				if !k.removed {
					l.heap.push(item{at: at, k: k})
				}
			}
		})
	}
	if n := len(b.delays); n > 0 {
		delays := make([]statemachine.LockDelay, n)
		for i, e := range b.delays {
			delays[i] = e.ld
		}
		err := l.proposer.EndLockDelays(b.ctx, b.epoch, delays)
		l.proposed(b, "lock_delay", n, err, func(at time.Time) {
			for _, e := range b.delays {
				if !e.removed {
					l.heap.push(item{at: at, d: e})
				}
			}
		})
	}
}

func (l *Lessor) proposed(b *batch, kind string, n int, err error, requeue func(at time.Time)) {
	l.metrics.proposed.WithLabelValues(kind).Add(float64(n))
	if err == nil {
		l.logger.Debug("lessor: expiry proposed", "kind", kind, "n", n, "epoch", b.epoch)
		return
	}
	l.metrics.failed.WithLabelValues(kind).Add(float64(n))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term != b.term {
		// Demoted or re-promoted meanwhile: the items belong to a
		// leadership that is over, and the cancelled context is why the
		// proposal failed.
		l.logger.Debug("lessor: expiry abandoned with its term", "kind", kind, "n", n, "epoch", b.epoch, "err", err)
		return
	}
	l.logger.Warn("lessor: proposing expiry failed; will retry", "kind", kind, "n", n,
		"epoch", b.epoch, "retry_in", l.retry, "err", err)
	requeue(l.now().Add(l.retry))
}

// item is one deadline on the heap. Exactly one of s, k and d is set;
// which one is its kind, and the pointer is its identity: an item whose
// entry was forgotten or replaced is stale and dropped when popped.
type item struct {
	at time.Time
	s  *session
	k  *keyEntry
	d  *delayEntry
}

// stale must be called with Lessor.mu held.
func (it item) stale() bool {
	switch {
	case it.s != nil:
		return it.s.removed
	case it.k != nil:
		return it.k.removed
	default:
		return it.d.removed
	}
}

// deadlineHeap is a min-heap by at. It is written out rather than built on
// container/heap, whose any-typed Push and Pop allocate for every item.
type deadlineHeap []item

func (h deadlineHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *deadlineHeap) push(it item) {
	*h = append(*h, it)
	h.up(len(*h) - 1)
}

func (h *deadlineHeap) pop() item {
	old := *h
	n := len(old) - 1
	top := old[0]
	old[0] = old[n]
	old[n] = item{}
	*h = old[:n]
	if n > 0 {
		h.down(0)
	}
	return top
}

func (h deadlineHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h[i].at.Before(h[parent].at) {
			return
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func (h deadlineHeap) down(i int) {
	n := len(h)
	for {
		least := i
		if l := 2*i + 1; l < n && h[l].at.Before(h[least].at) {
			least = l
		}
		if r := 2*i + 2; r < n && h[r].at.Before(h[least].at) {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}

type metrics struct {
	sessions   prometheus.Gauge
	heartbeats prometheus.CounterFunc
	proposed   *prometheus.CounterVec
	failed     *prometheus.CounterVec
}

// newMetrics builds the metrics whether or not they are registered, so
// that the code counting them needs no nil checks.
func newMetrics(l *Lessor) metrics {
	return metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tenure_lessor_sessions",
			Help: "Sessions whose deadlines this leader is timing.",
		}),
		// Counted per shard and summed only when scraped: one shared
		// counter would be a cache line that every heartbeat fights over.
		heartbeats: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tenure_lessor_heartbeats_total",
			Help: "Heartbeats that renewed a session on this leader.",
		}, func() float64 {
			var n uint64
			for i := range l.shards {
				n += l.shards[i].beats.Load()
			}
			return float64(n)
		}),
		proposed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lessor_expiries_proposed_total",
			Help: "Expiries proposed to the log, by kind (session, key, lock_delay); retries count again.",
		}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lessor_expiries_failed_total",
			Help: "Expiries whose proposal failed and is retried or abandoned, by kind.",
		}, []string{"kind"}),
	}
}

func (m metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.sessions, m.heartbeats, m.proposed, m.failed} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

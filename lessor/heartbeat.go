package lessor

import (
	"sync"
	"sync/atomic"
	"time"
)

// A session's deadline moves only under its shard's mutex, which keeps
// Heartbeat off the heap and off Lessor.mu.
// The fields are ordered to fit Go's 48-byte size class.
type session struct {
	id  int64
	ttl time.Duration

	// guarded by the shard's mu
	deadline instant
	renewed  instant // when this leader last heard from the session, if heard
	heard    bool
	expiring bool

	removed bool // guarded by Lessor.mu; set when forgotten, making its heap item stale
}

type shard struct {
	mu     sync.Mutex // guards active, m, and the deadline, renewed and expiring of m's sessions
	active bool       // this node is leader; Heartbeat reads it without touching Lessor.mu
	m      map[int64]*session
	beats  atomic.Uint64
	_      [96]byte // keeps neighbouring shards' mutexes off one cache line
}

func (l *Lessor) shard(id int64) *shard { return &l.shards[shardOf(id)] }

// shardOf is the index of session id's shard. Session IDs are revisions,
// nearly consecutive; the multiply spreads them anyway should the
// allocation ever change.
func shardOf(id int64) int { return int((uint64(id) * 0x9E3779B97F4A7C15) >> 59) }

// setShards replaces every shard's sessions with maps[i], and sets whether
// it takes heartbeats. Each shard changes under its own mutex, so a
// heartbeat sees either the old sessions or the new, never a mix.
func (l *Lessor) setShards(maps [shardCount]map[int64]*session, active bool) {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.m, sh.active = maps[i], active
		sh.mu.Unlock()
	}
}

// Heartbeat renews a session on behalf of its client, on the API's
// goroutines, concurrently with everything else: deadline = now + TTL. It
// returns the session's TTL, ErrNotLeader when not leader (or not yet
// promoted, or without a leader lease a quorum confirmed: doc.go), or ErrSessionExpired when the session is unknown or its
// deadline has already passed.
//
// Heartbeat touches one shard's map and nothing else, so that 100,000
// sessions can each beat several times per TTL. A deadline only ever moves
// later, so that a heartbeat right after Promote keeps the election
// timeout's grace rather than cutting it short.
func (l *Lessor) Heartbeat(id int64) (time.Duration, error) {
	wall := l.now()
	if !l.leased(wall) {
		return 0, ErrNotLeader // doc.go: only under the leader's lease
	}
	now := l.instant(wall)
	sh := l.shard(id)
	sh.mu.Lock()
	if !sh.active {
		sh.mu.Unlock()
		return 0, ErrNotLeader
	}
	s := sh.m[id]
	if s == nil || s.expiring || now >= s.deadline {
		if s != nil {
			s.expiring = true
		}
		sh.mu.Unlock()
		return 0, ErrSessionExpired
	}
	s.deadline = max(s.deadline, now.add(s.ttl))
	s.renewed, s.heard = now, true
	ttl := s.ttl
	sh.mu.Unlock()
	sh.beats.Add(1)
	return ttl, nil
}

// Leading reports whether the lessor answers heartbeats for id: whether
// this node leads, as Heartbeat sees it. The server asks before it
// answers a session its state does not hold as expired without renewing
// anything (an ID nobody may heartbeat before its owner has it).
func (l *Lessor) Leading(id int64) bool {
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.active
}

// LastHeartbeat returns when this leader last renewed the session, for
// display; zero if unknown, or if the session has not beaten since this
// node became leader (the logged renew time is then the better answer).
// The monotonic reading is stripped: the time is only shown.
func (l *Lessor) LastHeartbeat(id int64) time.Time {
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s := sh.m[id]; s != nil && s.heard {
		return l.time(s.renewed).Round(0)
	}
	return time.Time{}
}

// Remaining returns the time until the session's deadline on this leader,
// for display (EXPIRES-IN); zero once the deadline has passed, and false
// when the session is unknown or this node is not leader.
func (l *Lessor) Remaining(id int64) (time.Duration, bool) {
	now := l.instant(l.now())
	sh := l.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.m[id]
	if s == nil {
		return 0, false
	}
	return max(time.Duration(s.deadline-now), 0), true
}

package auth

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimiter holds one token bucket per principal, made to the limits
// the policy in force sets, and remade when a reload changes them.
type RateLimiter struct {
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	limits Limits
	lim    *rate.Limiter
}

// maxBuckets bounds the map: principals come from credentials the
// policy accepted, but a pattern entry may match many names.
const maxBuckets = 65536

// Allow takes one request from g's principal's bucket, or returns an
// error naming the limit.
func (l *RateLimiter) Allow(g *Grants, now time.Time) error {
	if g.Limits.RequestsPerSecond == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil || len(l.buckets) >= maxBuckets {
		l.buckets = map[string]*bucket{}
	}
	b := l.buckets[g.Principal]
	if b == nil || b.limits != g.Limits {
		b = &bucket{limits: g.Limits, lim: rate.NewLimiter(rate.Limit(g.Limits.RequestsPerSecond), g.Limits.Burst)}
		l.buckets[g.Principal] = b
	}
	if !b.lim.AllowN(now, 1) {
		return fmt.Errorf("principal %s is over its limit of %v requests per second (burst %d) on this node", g.Principal, g.Limits.RequestsPerSecond, g.Limits.Burst)
	}
	return nil
}

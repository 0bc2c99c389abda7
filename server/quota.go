package server

import (
	"context"
	"fmt"
	"sync"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/frontend"
)

// Quotas. A parked wait (a waiting Acquire, a holder's grant watch) and
// an open watch (a lease or key watch stream, Connect or NDJSON) hold
// memory on the node for as long as the caller likes, and cost the
// caller nothing but a request: unbounded, one principal with a pipeline
// could exhaust a node. Each kind is bounded per principal (the policy's
// waits and watches) and per node (--max-waits, --max-watches). A slot
// is taken before anything is parked or registered, and given back when
// the call ends, on every path: the counts are exact, not sampled.
//
// Counts are per node: a principal may hold its limit on each node,
// which for waits (only the leader parks them) is the same thing.

// quota is a node's count of parked waits and open watches.
type quota struct {
	waits, watches slots
}

func newQuota() *quota {
	return &quota{
		waits:   slots{what: "parked waits", field: "waits", flag: "max-waits"},
		watches: slots{what: "open watches", field: "watches", flag: "max-watches"},
	}
}

// slots counts one kind of thing a node holds open for callers, per
// principal and in all. Its methods are safe for concurrent use.
type slots struct {
	what  string // as the refusal names it: "parked waits"
	field string // the policy limit: "waits"
	flag  string // the serve flag of the node's limit: "max-waits"

	mu    sync.Mutex     // guards held and total
	held  map[string]int // by principal; a principal at 0 has no entry
	total int
}

// take reserves a slot for principal, or refuses with frontend.ErrLimit
// naming the limit that is reached. perPrincipal and perNode of 0 are
// no limit; principal "" (no policy, or a node acting for itself) counts
// only against the node. A principal whose policy sets no limit of its
// own may hold half the node's slots (defaultShare), so that no one
// principal can take every slot and leave the others none. The caller
// calls release once the thing it holds ends; a second call does
// nothing.
func (s *slots) take(principal string, perPrincipal, perNode int) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	field := s.field + " in the policy"
	if principal != "" && perPrincipal == 0 && perNode > 0 {
		perPrincipal = defaultShare(perNode)
		field = fmt.Sprintf("half of --%s, as the policy sets no %s", s.flag, s.field)
	}
	if n := s.held[principal]; principal != "" && perPrincipal > 0 && n >= perPrincipal {
		return nil, fmt.Errorf("%w: principal %s has %d %s, its limit (%s)", frontend.ErrLimit, principal, n, s.what, field)
	}
	if perNode > 0 && s.total >= perNode {
		return nil, fmt.Errorf("%w: this node has %d %s, its limit (--%s)", frontend.ErrLimit, s.total, s.what, s.flag)
	}
	s.total++
	if principal != "" {
		if s.held == nil {
			s.held = map[string]int{}
		}
		s.held[principal]++
	}
	var once sync.Once
	return func() { once.Do(func() { s.give(principal) }) }, nil
}

// defaultShare is how many of a node's perNode slots a principal may
// hold when its policy does not say: half, at least one.
func defaultShare(perNode int) int { return max(perNode/2, 1) }

func (s *slots) give(principal string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if principal == "" {
		return
	}
	if s.held[principal]--; s.held[principal] <= 0 {
		delete(s.held, principal) // names come from callers: keep no zeros
	}
}

// holdWait takes a parked-wait slot for the caller of ctx.
func (s *Server) holdWait(ctx context.Context) (release func(), err error) {
	principal, lim, err := s.quotaOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.quota.waits.take(principal, lim.Waits, s.cfg.Limits.MaxWaits)
}

// holdWatch takes an open-watch slot for the caller of ctx.
func (s *Server) holdWatch(ctx context.Context) (release func(), err error) {
	principal, lim, err := s.quotaOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.quota.watches.take(principal, lim.Watches, s.cfg.Limits.MaxWatches)
}

// quotaOf is the principal the caller of ctx counts as, with its policy
// limits: none without a policy, or for a node acting for itself. A
// call forwarded by a follower counts as its principal here too.
func (s *Server) quotaOf(ctx context.Context) (string, auth.Limits, error) {
	if !s.policyOn() {
		return "", auth.Limits{}, nil
	}
	g, err := s.grants(ctx, false)
	if err != nil || g == nil {
		return "", auth.Limits{}, s.refusal(ctx, err)
	}
	return g.Principal, g.Limits, nil
}

// count is how many slots principal holds.
func (s *slots) count(principal string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[principal]
}

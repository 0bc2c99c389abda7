package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/statemachine"
)

// Max hold: a lease may bound how long one holder keeps a grant — for the
// stuck cron job that would hold a lock for days. The leader looks every
// maxHoldTick: a grant past acquire time + max_hold is asked to step down
// (its client's grant ends with ErrStepDown, reason "max-hold"), and one
// still held MaxHoldGrace after that is revoked, with an audit entry.
//
// It is a policy, not a safety bound, so it is timed on the leader's wall
// clock against the logged acquire time: a new leader picks up where the
// old one was, and a clock that jumps makes it early or late, never
// unsafe — a revoke is an administrator's break-lock, fenced by tokens
// like any other.

// maxHoldTick is how often the leader looks: how late, at most, a step
// down or revoke comes.
const maxHoldTick = time.Second

// maxHoldReason is the step-down and revoke reason a client sees.
const maxHoldReason = "max-hold"

func (s *Server) maxHoldLoop() {
	t := time.NewTicker(maxHoldTick)
	defer t.Stop()
	for {
		select {
		case <-s.stopC:
			return
		case <-t.C:
		}
		if !s.leading.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.enforceMaxHold(ctx, time.Now()); err != nil {
			s.log.Warn("max hold not enforced this round; trying again", "err", err)
		}
		cancel()
	}
}

// enforceMaxHold asks grants past their max hold to step down and
// revokes those still held a grace later.
func (s *Server) enforceMaxHold(ctx context.Context, now time.Time) error {
	var grants []statemachine.MaxHoldGrant
	var version int
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		grants, version = m.MaxHoldGrants(), m.ClusterVersion()
		return nil
	})
	if version < 3 || len(grants) == 0 {
		return nil // an older member would not apply AskStepDown
	}
	grace := s.cfg.Limits.MaxHoldGrace
	for _, g := range grants {
		deadline := time.Unix(0, g.AcquireTime+g.MaxHold)
		maxHold := time.Duration(g.MaxHold)
		switch {
		case now.Before(deadline), g.AskedToStep && now.Before(deadline.Add(grace)):
			continue
		case !g.AskedToStep:
			reason := fmt.Sprintf("%s: held for longer than its max hold of %v; revoked in %v unless released", maxHoldReason, maxHold, grace)
			if _, err := s.propose(ctx, statemachine.AskStepDown{Lease: g.Lease, Token: g.Token, Reason: reason}); err != nil && !isGone(err) {
				return err
			}
			s.log.Info("grant past its max hold asked to step down", "lease", g.Lease.String(), "token", g.Token, "holder", g.Holder, "max_hold", maxHold)
			continue
		}
		reason := fmt.Sprintf("%s: held past its max hold of %v and the %v grace", maxHoldReason, maxHold, grace)
		res, err := s.propose(ctx, statemachine.Revoke{Lease: g.Lease, Token: g.Token, Reason: reason})
		if isGone(err) {
			continue // released meanwhile
		}
		e := auth.Entry{Principal: "(server)", Action: "max-hold.revoke", Target: g.Lease.String(), Outcome: "allowed", Reason: fmt.Sprintf("token %d of %s: %s", g.Token, g.Holder, reason)}
		if err != nil {
			e.Outcome, e.Reason = "failed", err.Error()
		}
		s.auditor().Record(ctx, e)
		if err != nil {
			return err
		}
		s.log.Warn("grant past its max hold revoked", "lease", g.Lease.String(), "token", g.Token, "holder", g.Holder, "revoked", res.Revoked)
	}
	return nil
}

// isGone reports whether err says the grant is no longer there.
func isGone(err error) bool {
	return errors.Is(err, statemachine.ErrNotHolder) || errors.Is(err, statemachine.ErrLeaseNotFound)
}

// auditor is where server-made administrative actions are recorded: the
// audit trail with a policy, the log's audit lines without one.
func (s *Server) auditor() *auth.Auditor {
	if s.policyOn() {
		return s.auth.audit
	}
	return auth.NewAuditor(s.log.With("log", "audit"))
}

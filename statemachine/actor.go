package statemachine

import (
	"fmt"

	"github.com/tenurehq/tenure/internal/glob"
)

// Only the owner acts, decided where it is applied (DESIGN.md, safety
// rule 10). A check at the API edge reads the node's state as it was
// when the request arrived; the command it lets through is applied
// later, perhaps to a session that did not exist yet when it was
// checked: session IDs and tokens are the next revision, which anybody
// can read and aim at. So a command that acts on a session or a grant
// carries its Actor — the principal that proposed it and the identity
// patterns its policy gave it — and the machine refuses it here, against
// the session's or grant's identity as it is at this entry, on every
// replica alike. The edge's check stays as a fast path.

// Actor is who proposed a command that acts on a session or a grant. A
// nil Actor is a node acting for itself, or a server without a policy:
// nothing is checked.
type Actor struct {
	// Principal is the authenticated name, for the error and the audit
	// line.
	Principal string `json:"principal"`
	// Identities are the holder identity patterns the principal may act
	// as ('*' stands for any run of characters).
	Identities []string `json:"identities,omitempty"`
	// Breaker is set for a cluster admin, who may end what another
	// identity holds (close its session, release its grant) but never
	// act as its holder (acquire, set a value, bind a key).
	Breaker bool `json:"breaker,omitempty"`
}

// WithActor returns cmd with its Actor set to a, when cmd acts on a
// session or a grant; any other command is returned as it is.
func WithActor(cmd Command, a *Actor) Command {
	switch c := cmd.(type) {
	case CloseSession:
		c.Actor = a
		return c
	case Acquire:
		c.Actor = a
		return c
	case Release:
		c.Actor = a
		return c
	case SetValue:
		c.Actor = a
		return c
	case CancelWait:
		c.Actor = a
		return c
	case Put:
		c.Actor = a
		return c
	case CompareAndSwap:
		c.Actor = a
		return c
	case Txn:
		c.Actor = a
		return c
	}
	return cmd
}

// ActorOf is the Actor cmd carries, nil for a command that has none.
func ActorOf(cmd Command) *Actor {
	switch c := cmd.(type) {
	case CloseSession:
		return c.Actor
	case Acquire:
		return c.Actor
	case Release:
		return c.Actor
	case SetValue:
		return c.Actor
	case CancelWait:
		return c.Actor
	case Put:
		return c.Actor
	case CompareAndSwap:
		return c.Actor
	case Txn:
		return c.Actor
	}
	return nil
}

// may reports whether the actor may act as identity.
func (a *Actor) may(identity string) bool {
	if a == nil {
		return true
	}
	for _, p := range a.Identities {
		if glob.Match(p, identity) {
			return true
		}
	}
	return false
}

// ownerChecks reports whether actors are checked at this entry: from
// cluster version 4 on, since a replica of an older build would apply
// what a newer one refuses.
func (m *Machine) ownerChecks() bool { return m.atLeast(4) }

// actAs refuses the actor's command on session s unless the actor may
// act as s's identity; ending may be set for commands that only end what
// s holds, which a breaker may do for anybody.
func (m *Machine) actAs(a *Actor, s *sessionState, what string, ending bool) error {
	if a == nil || !m.ownerChecks() || a.may(s.Identity) || ending && a.Breaker {
		return nil
	}
	return fmt.Errorf("%w: %s may not %s session %d of identity %q", ErrNotOwner, a.Principal, what, s.ID, s.Identity)
}

// actOnGrant is actAs for the grant g.
func (m *Machine) actOnGrant(a *Actor, l LeaseID, h *holder, what string, ending bool) error {
	if a == nil || !m.ownerChecks() || a.may(h.identity) || ending && a.Breaker {
		return nil
	}
	return fmt.Errorf("%w: %s may not %s the grant of %s held by %q (token %d)", ErrNotOwner, a.Principal, what, l, h.identity, h.token)
}

package server

import (
	"context"
	"fmt"
	"slices"

	"github.com/tenurehq/tenure/statemachine"
)

// A grant watch parks until its grant ends. One for a token that never
// was a grant would park forever, so any principal allowed to watch a
// namespace could pile them up (one pipeline held 65,536): a grant watch
// is admitted only for a grant that can still end. The holder's client
// starts watching once its Acquire has returned, so the grant is in the
// leader's applied state by then, and a grant that has already ended is
// answered with the event that ended it, as it always was.

// grantWatchStart decides a grant watch of token on lease id from the
// applied state, before anything parks:
//   - a current grant: ended is nil, and from is where to watch from
//     (start, or when start is 0 the revision after the state read, so
//     that an end applied meanwhile is not missed);
//   - a grant that has ended: ended is the event that ended it, from the
//     watch history;
//   - anything else: an error wrapping statemachine.ErrNotHolder. A
//     history that no longer reaches back to the token gives the watch's
//     ErrCompacted, which tells the holder to ask Validate.
func (s *Server) grantWatchStart(ctx context.Context, id statemachine.LeaseID, token, start int64) (ended *statemachine.Event, from int64, err error) {
	var current bool
	var last int64
	err = s.node.ReadLocal(func(m *statemachine.Machine) error {
		if l, ok := m.Lease(id); ok {
			current = slices.ContainsFunc(l.Holders, func(g statemachine.Grant) bool { return g.Token == token })
		}
		// The hub is published to under the state's write lock: every
		// event of the state read is in it, and none after.
		last = s.hub.Revision()
		return nil
	})
	switch {
	case err != nil:
		return nil, 0, err
	case current && start == 0:
		return nil, last + 1, nil
	case current:
		return nil, start, nil
	}
	notGrant := func() error {
		return fmt.Errorf("%w: token %d is not a grant of %s, held or ended, as of revision %d; a grant watch is for a holder's own grant",
			statemachine.ErrNotHolder, token, id, last)
	}
	if token > last {
		return nil, 0, notGrant()
	}
	// The grant, if token is one, was acquired at revision token (a
	// token is its grant's revision) and has ended by last. Read the
	// history between them, stopping at last at the latest.
	w, err := s.hub.Watch(token, func(e *statemachine.Event) bool {
		return e.Revision == token || e.Revision >= last || (e.Lease == id && e.Token == token && endsGrant(e))
	})
	if err != nil {
		return nil, 0, err
	}
	defer w.Close()
	granted := false
	for {
		e, err := w.Next(ctx)
		if err != nil {
			return nil, 0, err
		}
		if e.Lease == id && e.Token == token {
			if e.Revision == token && e.Type == statemachine.EventLeaseAcquired {
				granted = true
			} else if granted && endsGrant(&e) {
				return &e, 0, nil
			}
		}
		if !granted || e.Revision >= last {
			return nil, 0, notGrant()
		}
	}
}

// endsGrant reports whether e ends the grant it names.
func endsGrant(e *statemachine.Event) bool {
	switch e.Type {
	case statemachine.EventLeaseReleased, statemachine.EventLeaseReleasedBy,
		statemachine.EventLeaseExpired, statemachine.EventLeaseRevoked:
		return true
	}
	return false
}

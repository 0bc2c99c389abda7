package linearizability

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// LeaseOp is what a lease call does. Every lease in a history is a mutex
// (capacity 1).
type LeaseOp int

const (
	// Acquire asks for the lease for Session without waiting.
	Acquire LeaseOp = iota + 1
	// Release gives back the grant with Token.
	Release
	// Validate asks whether Token is the current holder's.
	Validate
)

// LeaseInput is a lease call.
type LeaseInput struct {
	Op      LeaseOp
	Lease   string
	Session int64 // Acquire
	Token   int64 // Release, Validate
}

// LeaseOutput is a lease call's result.
type LeaseOutput struct {
	// Unknown: the call may or may not have taken effect.
	Unknown bool
	// OK: Acquire granted (Token is the grant's), Release released,
	// Validate found Token valid.
	OK bool
	// Token: Acquire's grant; Validate's current holder token (0 when
	// the lease has no holder).
	Token int64
}

// leaseState is one lease. A grant whose acquire had an unknown outcome
// is held with token 0 and bound when a later call reveals it.
type leaseState struct {
	held    bool
	token   int64 // 0 while held by an unknown acquire's grant
	session int64
	// max is the highest token granted so far: a new grant's token must
	// be higher (safety rule 1).
	max int64
}

// LeaseModel is a mutex per lease with fencing tokens, with histories
// split per lease.
var LeaseModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byLease := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range history {
			k := op.Input.(LeaseInput).Lease
			if _, ok := byLease[k]; !ok {
				names = append(names, k)
			}
			byLease[k] = append(byLease[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range names {
			out = append(out, byLease[k])
		}
		return out
	},
	Init: func() []any { return []any{leaseState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(leaseState), input.(LeaseInput), output.(LeaseOutput)
		switch in.Op {
		case Acquire:
			return stepAcquire(s, in, out)
		case Release:
			return stepRelease(s, in, out)
		case Validate:
			return stepValidate(s, in, out)
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(LeaseInput), output.(LeaseOutput)
		res := fmt.Sprintf("%v", out.OK)
		if out.Unknown {
			res = "unknown"
		}
		switch in.Op {
		case Acquire:
			if out.OK {
				res = fmt.Sprintf("granted %d", out.Token)
			}
			return fmt.Sprintf("acquire(%s, session %d) -> %s", in.Lease, in.Session, res)
		case Release:
			return fmt.Sprintf("release(%s, %d) -> %s", in.Lease, in.Token, res)
		}
		return fmt.Sprintf("validate(%s, %d) -> %s, current %d", in.Lease, in.Token, res, out.Token)
	},
	DescribeState: func(state any) string {
		s := state.(leaseState)
		if !s.held {
			return fmt.Sprintf("free (max %d)", s.max)
		}
		return fmt.Sprintf("held by session %d, token %d (max %d)", s.session, s.token, s.max)
	},
}

func stepAcquire(s leaseState, in LeaseInput, out LeaseOutput) []any {
	mine := s.held && s.session == in.Session
	switch {
	case out.Unknown:
		if !s.held {
			return []any{s, leaseState{held: true, session: in.Session, max: s.max}}
		}
		return []any{s} // held: granted again to its holder, or refused
	case out.OK && !s.held:
		if out.Token > s.max {
			return []any{leaseState{held: true, token: out.Token, session: in.Session, max: out.Token}}
		}
	case out.OK && mine && s.token == 0:
		// The unknown acquire's grant, now revealed.
		if out.Token > s.max {
			return []any{leaseState{held: true, token: out.Token, session: in.Session, max: out.Token}}
		}
	case out.OK && mine:
		if out.Token == s.token {
			return []any{s} // acquire is idempotent per session
		}
	case !out.OK && s.held && !mine:
		return []any{s}
	}
	return nil
}

func stepRelease(s leaseState, in LeaseInput, out LeaseOutput) []any {
	free := leaseState{max: max(s.max, in.Token)}
	// The grant is in.Token: known, or the unknown acquire's if in.Token
	// is newer than every token known.
	is := s.held && (s.token == in.Token || s.token == 0 && in.Token > s.max)
	switch {
	case out.Unknown && is:
		return []any{s, free}
	case out.Unknown:
		return []any{s}
	case out.OK && is:
		return []any{free}
	case !out.OK && !(s.held && s.token == in.Token):
		return []any{s}
	}
	return nil
}

func stepValidate(s leaseState, in LeaseInput, out LeaseOutput) []any {
	switch {
	case out.Unknown:
		return []any{s}
	case !s.held:
		if !out.OK && out.Token == 0 {
			return []any{s}
		}
	case s.token == 0:
		// Held by the unknown acquire's grant: the answer reveals it.
		if out.Token > s.max && out.OK == (out.Token == in.Token) {
			return []any{leaseState{held: true, token: out.Token, session: s.session, max: out.Token}}
		}
	default:
		if out.Token == s.token && out.OK == (s.token == in.Token) {
			return []any{s}
		}
	}
	return nil
}

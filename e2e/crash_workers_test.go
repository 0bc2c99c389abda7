package e2e

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// --- puts ---

// putWorker writes "1", "2", "3"... to its own key, one at a time. Its
// fields are written by its goroutine during a round and read by the test
// goroutine between rounds.
type putWorker struct {
	key       string
	attempted int64 // T: the highest value ever sent
	ackedVal  int64 // A: the highest value acknowledged
	applied   int64 // puts known to be applied: the key's expected version
	acked     int   // acknowledged puts
	revs      []int64
	lastErr   *callErr
	problems  []string
}

func (p *putWorker) run(ctx context.Context, api *apiClients) {
	for ctx.Err() == nil {
		p.attempted++
		v := p.attempted
		resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.PutResponse], error) {
			return api.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: p.key, Value: strconv.FormatInt(v, 10)}))
		})
		if err != nil {
			// Unknown outcome: wait for the restart to find out.
			p.lastErr = &callErr{err, time.Now()}
			if verdict(err) {
				p.problems = append(p.problems, fmt.Sprintf("put %s=%d: got = %v, expected: success or a lost connection", p.key, v, err))
			}
			return
		}
		p.ackedVal = v
		p.applied++
		p.acked++
		p.revs = append(p.revs, resp.Msg.Revision)
	}
}

func (p *putWorker) check(ctx context.Context, api *apiClients, w *workload) []string {
	var val, version int64
	resp, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
		return api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: p.key}))
	})
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
	case err != nil:
		return []string{fmt.Sprintf("get %s: %v", p.key, err)}
	default:
		version = resp.Msg.Kv.Version
		if val, err = strconv.ParseInt(resp.Msg.Kv.Value, 10, 64); err != nil {
			return []string{fmt.Sprintf("%s: value got = %q, expected: a number", p.key, resp.Msg.Kv.Value)}
		}
	}
	var problems []string
	switch {
	case val == p.ackedVal:
		if p.attempted > p.ackedVal {
			w.putsLost++
		}
	case val == p.attempted:
		// The one unacknowledged put was applied.
		w.putsApplied++
		p.applied++
	default:
		problems = append(problems, fmt.Sprintf("%s: value got = %d, expected: %d (last acknowledged) or %d (last attempted)", p.key, val, p.ackedVal, p.attempted))
	}
	if version != p.applied {
		problems = append(problems, fmt.Sprintf("%s: version got = %d, expected: %d (puts applied; %d attempted, %d acknowledged)", p.key, version, p.applied, p.attempted, p.acked))
	}
	// The next round writes on from attempted+1, whatever happened.
	p.ackedVal = val
	return problems
}

// --- compare-and-swap counter ---

const counterKey = "crash/counter"

// casWorker increments the counter: read it, then swap in value+1 if its
// mod_revision has not moved. A failed compare changes nothing and is
// retried; any other failure leaves an unknown outcome.
type casWorker struct {
	id                       int
	acked, unknown           int // this round
	ackedTotal, unknownTotal int
	revs                     []int64
	lastErr                  *callErr
	problems                 []string
}

func (c *casWorker) run(ctx context.Context, api *apiClients) {
	for ctx.Err() == nil {
		cur, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
			return api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: counterKey}))
		})
		if err != nil {
			c.lastErr = &callErr{err, time.Now()}
			return
		}
		n, err := strconv.ParseInt(cur.Msg.Kv.Value, 10, 64)
		if err != nil {
			c.problems = append(c.problems, fmt.Sprintf("%s: value got = %q, expected: a number", counterKey, cur.Msg.Kv.Value))
			return
		}
		next := strconv.FormatInt(n+1, 10)
		resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.CompareAndSwapResponse], error) {
			return api.kv.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{
				Key:     counterKey,
				Compare: &tenurev1.Compare{Target: &tenurev1.Compare_ModRevision{ModRevision: cur.Msg.Kv.ModRevision}},
				Value:   next,
			}))
		})
		if connect.CodeOf(err) == connect.CodeFailedPrecondition {
			continue // another worker got there first
		}
		if err != nil {
			c.lastErr = &callErr{err, time.Now()}
			c.unknown++
			if verdict(err) {
				c.problems = append(c.problems, fmt.Sprintf("compare-and-swap %s to %s: got = %v, expected: success, compare failed or a lost connection", counterKey, next, err))
			}
			return
		}
		if resp.Msg.Kv.GetValue() != next {
			c.problems = append(c.problems, fmt.Sprintf("compare-and-swap %s: value got = %q, expected: %q", counterKey, resp.Msg.Kv.GetValue(), next))
		}
		c.acked++
		c.revs = append(c.revs, resp.Msg.Revision)
	}
}

// checkCounter compares the counter after a restart with the value at the
// last check plus this round's increments, then takes it as the new base.
func (w *workload) checkCounter(kv *tenurev1.KeyValue) []string {
	var acked, unknown int64
	for _, c := range w.cas {
		acked += int64(c.acked)
		unknown += int64(c.unknown)
		c.ackedTotal += c.acked
		c.unknownTotal += c.unknown
		c.acked, c.unknown = 0, 0
	}
	n, err := strconv.ParseInt(kv.GetValue(), 10, 64)
	if err != nil {
		return []string{fmt.Sprintf("%s: value got = %q, expected: a number", counterKey, kv.GetValue())}
	}
	lo, hi := w.counter+acked, w.counter+acked+unknown
	var problems []string
	if n < lo || n > hi {
		problems = append(problems, fmt.Sprintf("%s: got = %d, expected: between %d and %d (was %d, then %d acknowledged and %d unknown increments)", counterKey, n, lo, hi, w.counter, acked, unknown))
	} else {
		w.casApplied += int(n - lo)
		w.casLost += int(hi - n)
	}
	w.counter = n
	return problems
}

// --- leases ---

type leaseOp int

const (
	opNone leaseOp = iota
	opAcquire
	opRelease
)

type ackedRev struct {
	rev  int64
	what string
}

// leaseWorker acquires and releases one lease with its own session, one
// call at a time. held is the token it holds (0: free); pending is a call
// sent after the last known state whose outcome is unknown.
type leaseWorker struct {
	name, identity     string
	session            int64
	held               int64
	maxToken           int64 // the highest token ever granted for the lease
	lastReleased       int64 // the token of the last acknowledged release
	pending            leaseOp
	acquires, releases int
	revs               []ackedRev
	lastErr            *callErr
	problems           []string
}

func (l *leaseWorker) run(ctx context.Context, api *apiClients) {
	for ctx.Err() == nil {
		if l.held == 0 {
			l.pending = opAcquire
			resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.AcquireResponse], error) {
				return api.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: l.session, Name: l.name}))
			})
			if err != nil {
				l.failed("acquire", err)
				return
			}
			l.pending = opNone
			tok := resp.Msg.Token
			if !resp.Msg.Acquired {
				l.problems = append(l.problems, fmt.Sprintf("acquire %s: got = not acquired (holder %q), expected: granted, nobody else uses it", l.name, resp.Msg.Lease.GetHolderIdentity()))
				return
			}
			if tok <= l.maxToken {
				l.problems = append(l.problems, fmt.Sprintf("acquire %s: token got = %d, expected: above %d, the highest granted before", l.name, tok, l.maxToken))
			}
			l.held, l.maxToken = tok, max(l.maxToken, tok)
			l.acquires++
			l.revs = append(l.revs, ackedRev{tok, fmt.Sprintf("acquire %s", l.name)})
			continue
		}
		l.pending = opRelease
		resp, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ReleaseResponse], error) {
			return api.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Name: l.name, Token: l.held}))
		})
		if err != nil {
			l.failed(fmt.Sprintf("release token %d of", l.held), err)
			return
		}
		l.pending = opNone
		l.lastReleased, l.held = l.held, 0
		l.releases++
		l.revs = append(l.revs, ackedRev{resp.Msg.Revision, fmt.Sprintf("release %s", l.name)})
	}
}

func (l *leaseWorker) failed(op string, err error) {
	l.lastErr = &callErr{err, time.Now()}
	if verdict(err) {
		l.problems = append(l.problems, fmt.Sprintf("%s %s: got = %v, expected: success or a lost connection", op, l.name, err))
	}
}

// check asks Validate what the restarted server says about the lease and
// compares it with the last acknowledged call and the pending one.
func (l *leaseWorker) check(ctx context.Context, api *apiClients, w *workload) []string {
	token := l.held
	if token == 0 {
		token = max(l.lastReleased, 1) // Validate wants a positive token
	}
	resp, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ValidateResponse], error) {
		return api.leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Name: l.name, Token: token}))
	})
	if err != nil {
		return []string{fmt.Sprintf("validate %s token %d: %v", l.name, token, err)}
	}
	v := resp.Msg
	if len(v.Tokens) > 1 {
		return []string{fmt.Sprintf("%s: holders' tokens got = %v, expected: at most one, it is a mutex", l.name, v.Tokens)}
	}
	mine := len(v.Tokens) == 1 && v.HolderIdentity == l.identity
	var problems []string
	switch {
	case l.held != 0 && l.pending == opNone:
		if !v.Valid {
			problems = append(problems, fmt.Sprintf("%s: acknowledged grant with token %d lost: got = valid %v, holder %q, tokens %v, expected: valid", l.name, l.held, v.Valid, v.HolderIdentity, v.Tokens))
		}
	case l.held != 0 && l.pending == opRelease:
		switch {
		case v.Valid:
			w.releasesLost++
		case len(v.Tokens) == 0:
			w.releasesApplied++
			l.lastReleased, l.held = l.held, 0
		default:
			problems = append(problems, fmt.Sprintf("%s: after an unacknowledged release of token %d: got = holder %q, tokens %v, expected: still token %d or free", l.name, l.held, v.HolderIdentity, v.Tokens, l.held))
		}
	case l.held == 0 && l.pending == opNone:
		if len(v.Tokens) != 0 {
			problems = append(problems, fmt.Sprintf("%s: acknowledged release of token %d lost: got = holder %q, tokens %v, expected: free", l.name, l.lastReleased, v.HolderIdentity, v.Tokens))
		}
	case l.held == 0 && l.pending == opAcquire:
		switch {
		case len(v.Tokens) == 0:
			w.acquiresLost++
		case mine && v.CurrentToken > l.maxToken:
			// The unacknowledged acquire was applied: the grant is ours,
			// and the next round releases it.
			w.acquiresApplied++
			l.held, l.maxToken = v.CurrentToken, v.CurrentToken
			problems = append(problems, w.ack("global", v.CurrentToken, fmt.Sprintf("acquire %s (unacknowledged, found applied)", l.name))...)
		default:
			problems = append(problems, fmt.Sprintf("%s: after an unacknowledged acquire: got = holder %q, tokens %v, expected: free, or held by %q with a token above %d", l.name, v.HolderIdentity, v.Tokens, l.identity, l.maxToken))
		}
	}
	l.pending = opNone
	return problems
}

//go:build linux

package etcd

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// How long the runner waits for what a server owes: an answer, the
// events a watch is due, a cancel. Generous: the machine may be shared.
const (
	callTimeout  = 20 * time.Second
	eventTimeout = 15 * time.Second
)

// state is what the runner knows of etcd's store, from etcd's answers:
// the revisions operations name relatively.
type state struct {
	cur       int64 // the highest header revision etcd has answered
	compacted int64 // the revision of the last compaction etcd accepted; 0 before any
}

func (st state) String() string { return fmt.Sprintf("cur=%d compacted=%d", st.cur, st.compacted) }

// answer is one side's answer to an operation, rendered.
type answer struct {
	text string
	rev  int64 // the header revision of an answer that is not an error
	ok   bool  // not an error
}

// --- the runner ---

// watchSpec is what a watch covers, and so which of the events etcd's
// watch of every key has sent it is due.
type watchSpec struct {
	r               keyRange
	start           int64 // resolved start revision; 0 for now
	after           int64 // for a start of 0: the revision it was opened at
	noPut, noDelete bool
	compacted       bool // it starts before the compacted revision: a cancel is due
}

// step is one operation of a run as it went: the state it ran in, and
// etcd's and Tenure's answers.
type step struct {
	before  state
	op      operation
	answers []string
}

// difference is where etcd and Tenure first disagreed.
type difference struct {
	at           int    // the index of the operation after which they differ
	what         string // what differs
	etcd, tenure string
}

// runStats counts what a run compared.
type runStats struct {
	ops, answers, events int
	errors               map[string]int // etcd's error answers, by text
}

func (a *runStats) add(b runStats) {
	a.ops += b.ops
	a.answers += b.answers
	a.events += b.events
	for e, n := range b.errors {
		if a.errors == nil {
			a.errors = map[string]int{}
		}
		a.errors[e] += n
	}
}

// runResult is how a run of a sequence went.
type runResult struct {
	diff  *difference // nil when etcd and Tenure agreed on everything
	steps []step
	stats runStats
	rev   int64 // etcd's revision at the end
	n     int   // operations in the sequence; steps past them are the end's cancels
}

// runner runs a sequence on the sides, etcd's first, one operation at a
// time on each, and compares their answers.
type runner struct {
	ctx    context.Context // of the operation running
	st     state
	sides  []*side // etcd, then Tenure
	specs  map[int]*watchSpec
	n      int     // operations in the sequence
	opRevs []int64 // etcd's current revision after each operation
	seen   int     // items of the watches of every key compared so far
	res    runResult
}

// run runs ops on sides (etcd's, then Tenure's) and compares every
// answer, every event of the watches the operations open, and at every
// compaction, watch and cancel, and at the end, every event of each
// side's watch of every key from revision 1. At the end the watches left
// open are cancelled, in number order, and compared as a cancel would be.
func run(sides []*side, ops []operation) *runResult {
	x := &runner{sides: sides, specs: map[int]*watchSpec{}, n: len(ops), st: state{cur: 1}}
	x.res.n = len(ops)
	for i, o := range ops {
		if d := x.step(i, o); d != nil {
			x.res.diff = d
			return &x.res
		}
	}
	var open []int
	for w := range x.specs {
		open = append(open, w)
	}
	slices.Sort(open)
	for _, w := range open {
		if d := x.step(len(ops), &cancelOp{w: w}); d != nil {
			d.what = fmt.Sprintf("watch %d, open at the end", w)
			x.res.diff = d
			return &x.res
		}
	}
	x.res.diff = x.syncAll(len(ops))
	x.res.rev = x.st.cur
	return &x.res
}

// step runs operation i, o, on every side. i is len(ops) for what the
// runner does at the end.
func (x *runner) step(i int, o operation) *difference {
	switch o.(type) {
	case *compactOp, *watchOp, *cancelOp:
		// A compaction must not overtake a watch of every key still
		// catching up; a watch's due events are read from etcd's.
		if d := x.syncAll(i); d != nil {
			return d
		}
	}
	if w, ok := o.(*watchOp); ok {
		if _, open := x.specs[w.w]; !open {
			x.specs[w.w] = x.spec(w)
			if w.once {
				defer delete(x.specs, w.w)
			}
		}
	}
	before := x.st
	var answers []answer
	for _, s := range x.sides {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		x.ctx = ctx
		answers = append(answers, o.run(x, s))
		cancel()
	}
	x.after(o, before, answers[0])
	texts := make([]string, len(answers))
	for j, a := range answers {
		texts[j] = a.text
	}
	x.res.steps = append(x.res.steps, step{before: before, op: o, answers: texts})
	if i < x.n {
		x.opRevs = append(x.opRevs, x.st.cur)
		x.res.stats.ops++
	}
	x.res.stats.answers++
	if e, ok := strings.CutPrefix(texts[0], "error "); ok {
		if x.res.stats.errors == nil {
			x.res.stats.errors = map[string]int{}
		}
		x.res.stats.errors[e]++
	}
	if len(texts) == 2 && texts[0] != texts[1] {
		return &difference{at: min(i, x.n-1), what: "the answer", etcd: texts[0], tenure: texts[1]}
	}
	return nil
}

// after follows etcd's answer to o, run in state before.
func (x *runner) after(o operation, before state, a answer) {
	x.st.cur = max(x.st.cur, a.rev)
	switch o := o.(type) {
	case *compactOp:
		if a.ok {
			x.st.compacted = o.rev.resolve(before)
		}
	case *cancelOp:
		delete(x.specs, o.w)
	}
}

// spec resolves what watch o covers, as it opens in the current state.
// A once watch starts no later than the current revision and never at
// the compacted revision itself: whether it is then sent the deletions
// of that revision depends on how far etcd's background compaction has
// got, so it starts one later (or, when that is the future, one
// earlier).
func (x *runner) spec(o *watchOp) *watchSpec {
	start := o.from.resolve(x.st)
	if o.once {
		start = min(start, x.st.cur)
	}
	if start > 0 && start == x.st.compacted {
		if start < x.st.cur {
			start++
		} else {
			start--
		}
	}
	return &watchSpec{
		r: o.r, start: start, after: x.st.cur, noPut: o.noPut, noDelete: o.noDelete,
		compacted: start > 0 && start < x.st.compacted,
	}
}

// due is the revision of the last event watch w is due now, from etcd's
// watch of every key; 0 for none.
func (x *runner) due(w *watchSpec) int64 {
	resps, _ := x.sides[0].all.responses()
	from := w.start
	if from == 0 {
		from = w.after + 1
	}
	var last int64
	for _, r := range resps {
		for _, ev := range r.Events {
			switch {
			case ev.Kv.ModRevision < from, !w.r.contains(string(ev.Kv.Key)),
				w.noPut && ev.Type == mvccpb.PUT, w.noDelete && ev.Type == mvccpb.DELETE:
				continue
			}
			last = ev.Kv.ModRevision
		}
	}
	return last
}

// settle waits until watch h has what it is due: its events up to the
// current revision, or its cancel when it starts in the compacted past.
func (x *runner) settle(h *watchHandle, w *watchSpec) {
	due := x.due(w)
	h.waitFor(eventTimeout, func(resps []*pb.WatchResponse, err error) bool {
		if err != nil || canceled(resps) {
			return true
		}
		if w.compacted {
			return false
		}
		return lastEvent(resps) >= due
	})
}

// syncAll waits until each side's watch of every key has the events of
// the current revision, and compares what the two have received. i is
// the operation about to run.
func (x *runner) syncAll(i int) *difference {
	for _, s := range x.sides {
		s.all.waitFor(eventTimeout, func(resps []*pb.WatchResponse, err error) bool {
			return err != nil || canceled(resps) || len(resps) > 0 && (x.st.cur <= 1 || lastEvent(resps) >= x.st.cur)
		})
	}
	if len(x.sides) < 2 {
		return nil
	}
	want, got := x.sides[0].allItems(), x.sides[1].allItems()
	for j := range max(len(want), len(got)) {
		w, g := "(nothing)", "(nothing)"
		if j < len(want) {
			w = want[j]
		}
		if j < len(got) {
			g = got[j]
		}
		if w == g {
			continue
		}
		// Blame the first operation whose revision covers the event.
		at := min(i, x.n) - 1
		if rev := x.itemRev(j); rev > 0 {
			if k, _ := slices.BinarySearch(x.opRevs, rev); k < len(x.opRevs) {
				at = min(k, at)
			}
		}
		return &difference{at: max(at, 0), what: fmt.Sprintf("the watch of every key from revision 1, item %d", j+1), etcd: w, tenure: g}
	}
	x.res.stats.events += len(want) - x.seen
	x.seen = len(want)
	return nil
}

// itemRev is the revision of the j-th event item of the watches of every
// key, on whichever side has it; 0 when neither has an event there.
func (x *runner) itemRev(j int) int64 {
	var rev int64
	for _, s := range x.sides {
		resps, _ := s.all.responses()
		n := 0
		for _, r := range resps {
			if r.Created {
				n++
			}
			for _, ev := range r.Events {
				if n == j && (rev == 0 || ev.Kv.ModRevision < rev) {
					rev = ev.Kv.ModRevision
				}
				n++
			}
			if r.Canceled || (!r.Created && len(r.Events) == 0) {
				n++
			}
		}
	}
	return rev
}

// --- running each kind of operation ---

func (o *rangeOp) run(x *runner, s *side) answer {
	resp, err := s.kv.Range(x.ctx, o.request(x.st))
	return s.respond(resp, resp.GetHeader(), err)
}

func (o *putOp) run(x *runner, s *side) answer {
	resp, err := s.kv.Put(x.ctx, o.request(s))
	return s.respond(resp, resp.GetHeader(), err)
}

func (o *deleteOp) run(x *runner, s *side) answer {
	resp, err := s.kv.DeleteRange(x.ctx, o.request())
	return s.respond(resp, resp.GetHeader(), err)
}

func (o *txnOp) run(x *runner, s *side) answer {
	resp, err := s.kv.Txn(x.ctx, o.request(x.st, s))
	return s.respond(resp, resp.GetHeader(), err)
}

func (o *compactOp) run(x *runner, s *side) answer {
	resp, err := s.kv.Compact(x.ctx, &pb.CompactionRequest{Revision: o.rev.resolve(x.st), Physical: o.physical})
	return s.respond(resp, resp.GetHeader(), err)
}

func (o *grantOp) run(x *runner, s *side) answer {
	resp, err := s.lease.LeaseGrant(x.ctx, &pb.LeaseGrantRequest{ID: o.lease.id, TTL: o.ttl})
	if err == nil && o.lease.auto != "" {
		s.autos[o.lease.auto] = resp.ID
		s.names[resp.ID] = o.lease.auto
	}
	return s.respond(resp, resp.GetHeader(), err)
}

func (o *leaseOp) run(x *runner, s *side) answer {
	id := s.leaseID(o.lease)
	switch o.verb {
	case "revoke":
		resp, err := s.lease.LeaseRevoke(x.ctx, &pb.LeaseRevokeRequest{ID: id})
		return s.respond(resp, resp.GetHeader(), err)
	case "timetolive":
		resp, err := s.lease.LeaseTimeToLive(x.ctx, &pb.LeaseTimeToLiveRequest{ID: id, Keys: o.keys})
		if err == nil {
			// What is left of a TTL depends on when it was asked; that it
			// is within the granted TTL does not.
			if resp.TTL > 0 && resp.TTL <= resp.GrantedTTL {
				resp.TTL = resp.GrantedTTL
			}
			// etcd lists a lease's keys in no particular order.
			slices.SortFunc(resp.Keys, bytes.Compare)
		}
		return s.respond(resp, resp.GetHeader(), err)
	case "keepalive":
		ctx, cancel := context.WithCancel(x.ctx)
		defer cancel()
		st, err := s.lease.LeaseKeepAlive(ctx)
		if err == nil {
			err = st.Send(&pb.LeaseKeepAliveRequest{ID: id})
		}
		var resp *pb.LeaseKeepAliveResponse
		if err == nil {
			resp, err = st.Recv()
		}
		return s.respond(resp, resp.GetHeader(), err)
	default: // leases
		resp, err := s.lease.LeaseLeases(x.ctx, &pb.LeaseLeasesRequest{})
		if err == nil {
			slices.SortFunc(resp.Leases, func(a, b *pb.LeaseStatus) int { return strings.Compare(s.leaseName(a.ID), s.leaseName(b.ID)) })
		}
		return s.respond(resp, resp.GetHeader(), err)
	}
}

// run opens the watch; a once watch also takes what it is due and is
// cancelled. The answer is the created response (and for a once watch
// all that follows).
func (o *watchOp) run(x *runner, s *side) answer {
	if _, open := s.watches[o.w]; open {
		return answer{text: fmt.Sprintf("(watch %d is open already)", o.w)}
	}
	w := x.specs[o.w]
	key, end := w.r.bytes()
	req := &pb.WatchCreateRequest{Key: key, RangeEnd: end, StartRevision: w.start, PrevKv: o.prevKV, WatchId: o.id}
	if o.noPut {
		req.Filters = append(req.Filters, pb.WatchCreateRequest_NOPUT)
	}
	if o.noDelete {
		req.Filters = append(req.Filters, pb.WatchCreateRequest_NODELETE)
	}
	// A watch that starts in the compacted past goes on a stream of its
	// own: etcd keeps its ID taken on the stream after cancelling it, so
	// that the server picks another for the next watch there, while
	// Tenure frees it (docs/etcd.md lists this).
	ws := s.streamOf(o.on)
	if w.compacted {
		ws = nil
	}
	if ws == nil {
		var err error
		if ws, err = openStream(s.watcher); err != nil {
			return answer{text: errText(err)}
		}
	}
	h, err := ws.create(req)
	if err != nil {
		if ws.watches == 0 {
			ws.close()
		}
		return answer{text: "error " + err.Error()}
	}
	if o.once {
		x.settle(h, w)
		h.cancel()
	}
	resps, err := h.responses()
	a := answer{text: strings.Join(s.renderWatch(resps, err), "\n")}
	if len(resps) > 0 && resps[0].Created {
		a.rev, a.ok = resps[0].Header.GetRevision(), true
	}
	if o.once {
		h.done()
		x.countEvents(s, resps)
	} else {
		s.watches[o.w] = h
	}
	return a
}

// streamOf is the stream watch w is open on, or nil.
func (s *side) streamOf(w int) *watchStream {
	if h, ok := s.watches[w]; ok && w != 0 {
		return h.ws
	}
	return nil
}

// run takes what the watch is due, cancels it, and answers everything it
// received since it opened.
func (o *cancelOp) run(x *runner, s *side) answer {
	h, open := s.watches[o.w]
	if !open {
		return answer{text: fmt.Sprintf("(no watch %d open)", o.w)}
	}
	x.settle(h, x.specs[o.w])
	h.cancel()
	resps, err := h.responses()
	h.done()
	delete(s.watches, o.w)
	x.countEvents(s, resps)
	return answer{text: strings.Join(s.renderWatch(resps, err), "\n"), ok: true}
}

// countEvents counts the events etcd sent a watch, for the summary.
func (x *runner) countEvents(s *side, resps []*pb.WatchResponse) {
	if s != x.sides[0] {
		return
	}
	for _, r := range resps {
		x.res.stats.events += len(r.Events)
	}
}

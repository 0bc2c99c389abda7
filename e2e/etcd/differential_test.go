//go:build linux

package etcd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"
)

// TestDifferential sends one seeded random sequence of KV, Txn, lease,
// compaction and watch operations through clientv3 to etcd and to Tenure,
// and compares every answer field by field: header revisions, key-values
// with their create and mod revisions, versions and leases, prev_kvs,
// more, count, succeeded, deleted, error codes and texts, and every event
// of a watch over the whole keyspace from revision 1. Only what names the
// server (cluster and member IDs, raft term) is left out.
//
// TENURE_DIFF_SEED replays a seed (the failure message names it);
// TENURE_DIFF_OPS sets the length (300 by default).
func TestDifferential(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TENURE_DIFF_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TENURE_DIFF_SEED=%q: not a number: %v", s, err)
		}
		seed = v
	}
	n := 300
	if s := os.Getenv("TENURE_DIFF_OPS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			t.Fatalf("TENURE_DIFF_OPS=%q: not a positive number", s)
		}
		n = v
	}
	t.Logf("seed %d (TENURE_DIFF_SEED=%d replays it), %d operations", seed, seed, n)

	ref, sut, ok := pair(t)
	sides := []*side{newSide(t, ref)}
	if ok {
		sides = append(sides, newSide(t, sut))
	}
	differential(t, seed, n, sides)
}

// differential runs n operations of seed on sides[0] (etcd) and, if
// there, sides[1], comparing their answers.
func differential(t *testing.T, seed uint64, n int, sides []*side) {
	t.Helper()
	g := &gen{rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), rev: 1, errors: map[string]int{}}
	for i := range n {
		o := g.next()
		if o.syncWatches {
			for _, s := range sides {
				s.all.waitFor(t, g.rev)
			}
		}
		if o.watch != nil {
			o.watch.until = sides[0].all.lastDue(o.watch)
		}
		var outs []string
		for _, s := range sides {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			outs = append(outs, o.do(ctx, s))
			cancel()
		}
		g.observe(o, outs[0])
		if len(outs) == 2 && outs[0] != outs[1] {
			t.Fatalf("seed %d, operation %d of %d: %s\n  etcd:   %s\n  tenure: %s", seed, i+1, n, o.desc, outs[0], outs[1])
		}
	}
	// Every event of the whole keyspace, from revision 1.
	for _, s := range sides {
		s.all.waitFor(t, g.rev)
	}
	if len(sides) == 2 {
		want, got := sides[0].all.snapshot(), sides[1].all.snapshot()
		for i := range max(len(want), len(got)) {
			w, g := "(none)", "(none)"
			if i < len(want) {
				w = want[i]
			}
			if i < len(got) {
				g = got[i]
			}
			if w != g {
				t.Fatalf("seed %d: the watch from revision 1 differs at event %d of %d:\n  etcd:   %s\n  tenure: %s", seed, i+1, len(want), w, g)
			}
		}
	}
	t.Logf("%d operations, final revision %d, %d watch events; error answers: %v", n, g.rev, len(sides[0].all.snapshot()), g.errors)
}

// side is one server with its clients and its whole-keyspace watch.
type side struct {
	name  string
	c     *clientv3.Client
	lease pb.LeaseClient
	all   *eventLog
}

func newSide(t *testing.T, tg target) *side {
	c := newClient(t, tg)
	s := &side{name: tg.name, c: c, lease: pb.NewLeaseClient(c.ActiveConnection()), all: &eventLog{}}
	ctx, cancel := context.WithCancel(context.Background())
	wch := c.Watch(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(1), clientv3.WithPrevKV())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for resp := range wch {
			s.all.add(resp)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// eventLog is what one watch has received, rendered.
type eventLog struct {
	mu     sync.Mutex
	events []string
	last   int64 // the highest event revision seen
	end    string
	recs   []eventRec
}

type eventRec struct {
	typ mvccpb.Event_EventType
	key string
	rev int64
}

func (l *eventLog) add(resp clientv3.WatchResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range resp.Events {
		l.events = append(l.events, renderEvent(ev))
		l.recs = append(l.recs, eventRec{ev.Type, string(ev.Kv.Key), ev.Kv.ModRevision})
		l.last = max(l.last, ev.Kv.ModRevision)
	}
	if resp.Canceled || resp.Err() != nil {
		l.end = fmt.Sprintf("canceled compact_revision=%d err=%s", resp.CompactRevision, errText(resp.Err()))
		l.events = append(l.events, l.end)
	}
}

func (l *eventLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// waitFor waits until the watch has delivered the events of revision rev:
// every revision a write makes has at least one event.
func (l *eventLog) waitFor(t *testing.T, rev int64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		l.mu.Lock()
		last, end := l.last, l.end
		l.mu.Unlock()
		if last >= rev || rev <= 1 {
			return
		}
		if end != "" || time.Now().After(deadline) {
			t.Fatalf("the watch from revision 1 has events up to revision %d, not %d (%s)", last, rev, end)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func renderEvent(ev *clientv3.Event) string {
	s := fmt.Sprintf("%s kv={%s}", ev.Type, renderKV(ev.Kv))
	if ev.PrevKv != nil {
		s += fmt.Sprintf(" prev_kv={%s}", renderKV(ev.PrevKv))
	}
	return s
}

func renderKV(kv *mvccpb.KeyValue) string {
	if kv == nil {
		return "nil"
	}
	return kv.String()
}

// --- rendering answers ---

// errText is an error as a client sees it: its gRPC code and text.
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	if ee, ok := err.(rpctypes.EtcdError); ok {
		return fmt.Sprintf("%v %q", ee.Code(), ee.Error())
	}
	return fmt.Sprintf("%v %q", status.Code(err), err.Error())
}

// hdr clears what names the server rather than the data.
func hdr(h *pb.ResponseHeader) {
	if h != nil {
		h.ClusterId, h.MemberId, h.RaftTerm = 0, 0, 0
	}
}

func normTxn(r *pb.TxnResponse) {
	hdr(r.Header)
	for _, op := range r.Responses {
		switch x := op.Response.(type) {
		case *pb.ResponseOp_ResponseRange:
			hdr(x.ResponseRange.Header)
		case *pb.ResponseOp_ResponsePut:
			hdr(x.ResponsePut.Header)
		case *pb.ResponseOp_ResponseDeleteRange:
			hdr(x.ResponseDeleteRange.Header)
		case *pb.ResponseOp_ResponseTxn:
			normTxn(x.ResponseTxn)
		}
	}
}

// answer renders a response (normalised by norm) or an error.
func answer[R interface{ String() string }](r R, err error, norm func(R)) string {
	if err != nil {
		return "error " + errText(err)
	}
	norm(r)
	return r.String()
}

// --- the generator ---

// gen makes the random operations and follows etcd's answers to aim
// them: the current revision, the compacted one and the live leases.
type gen struct {
	rnd       *rand.Rand
	rev       int64 // header revision of the last answer
	compacted int64
	leases    []int64
	errors    map[string]int // answers per error
	depth     int            // of the txn being made; 0 outside txns
	// A txn being made has deletes, or puts with ignore_value or
	// ignore_lease, never both: a delete followed by such a put of the
	// same key in one txn passes etcd's checks, fails at apply, and etcd
	// (3.4 and 3.5 alike) panics ("unexpected error during txn").
	txnDeletes, txnIgnores bool
}

// op is one operation, run the same way on each side.
type op struct {
	desc        string
	do          func(ctx context.Context, s *side) string
	syncWatches bool // wait for the watches to reach the current revision first
	watch       *watchSpec
	compact     int64
	grant       int64
	revoke      int64
}

var diffKeys = []string{"a", "b", "c", "d/1", "d/2", "d/3", "e", "f/x"}

func (g *gen) key() string { return diffKeys[g.rnd.IntN(len(diffKeys))] }

func (g *gen) value() string {
	if g.rnd.IntN(8) == 0 {
		return ""
	}
	return fmt.Sprintf("v%d", g.rnd.IntN(5))
}

// revision is a revision around the interesting ones: compacted, current,
// future, or in between.
func (g *gen) revision() int64 {
	switch g.rnd.IntN(6) {
	case 0:
		return 0
	case 1:
		return g.rev
	case 2:
		return g.rev + 1 + g.rnd.Int64N(2)
	case 3:
		return max(g.compacted-g.rnd.Int64N(2), 1)
	default:
		return 1 + g.rnd.Int64N(g.rev)
	}
}

// leaseID is a live lease, sometimes one that does not exist.
func (g *gen) leaseID() int64 {
	if len(g.leases) == 0 || g.rnd.IntN(5) == 0 {
		return 1000 + g.rnd.Int64N(8)
	}
	return g.leases[g.rnd.IntN(len(g.leases))]
}

// keyRange is a key and options naming one key or a range of them.
func (g *gen) keyRange() (string, []clientv3.OpOption, string) {
	k := g.key()
	switch g.rnd.IntN(6) {
	case 0:
		return "d/", []clientv3.OpOption{clientv3.WithPrefix()}, "prefix d/"
	case 1:
		end := g.key()
		return k, []clientv3.OpOption{clientv3.WithRange(end)}, fmt.Sprintf("[%s,%s)", k, end)
	case 2:
		return k, []clientv3.OpOption{clientv3.WithFromKey()}, fmt.Sprintf("from %s", k)
	case 3:
		return "", []clientv3.OpOption{clientv3.WithPrefix()}, "all keys"
	default:
		return k, nil, k
	}
}

func (g *gen) rangeOp() (clientv3.Op, string) {
	k, opts, desc := g.keyRange()
	if g.rnd.IntN(3) == 0 {
		l := g.rnd.Int64N(4)
		opts = append(opts, clientv3.WithLimit(l))
		desc += fmt.Sprintf(" limit=%d", l)
	}
	if g.rnd.IntN(3) == 0 {
		tg := clientv3.SortTarget(g.rnd.IntN(5))
		or := clientv3.SortOrder(g.rnd.IntN(3))
		opts = append(opts, clientv3.WithSort(tg, or))
		desc += fmt.Sprintf(" sort=%v/%v", tg, or)
	}
	if g.rnd.IntN(3) == 0 {
		r := g.revision()
		opts = append(opts, clientv3.WithRev(r))
		desc += fmt.Sprintf(" rev=%d", r)
	}
	if g.rnd.IntN(4) == 0 {
		opts = append(opts, clientv3.WithSerializable())
		desc += " serializable"
	}
	switch g.rnd.IntN(6) {
	case 0:
		opts = append(opts, clientv3.WithKeysOnly())
		desc += " keys_only"
	case 1:
		opts = append(opts, clientv3.WithCountOnly())
		desc += " count_only"
	}
	if g.rnd.IntN(5) == 0 {
		r := g.revision()
		f := []func(int64) clientv3.OpOption{clientv3.WithMinModRev, clientv3.WithMaxModRev, clientv3.WithMinCreateRev, clientv3.WithMaxCreateRev}
		i := g.rnd.IntN(len(f))
		opts = append(opts, f[i](r))
		desc += fmt.Sprintf(" %s=%d", []string{"min_mod", "max_mod", "min_create", "max_create"}[i], r)
	}
	return clientv3.OpGet(k, opts...), "range " + desc
}

func (g *gen) putOp() (clientv3.Op, string) {
	k, v := g.key(), g.value()
	var opts []clientv3.OpOption
	desc := fmt.Sprintf("put %s=%q", k, v)
	if g.rnd.IntN(2) == 0 {
		opts = append(opts, clientv3.WithPrevKV())
		desc += " prev_kv"
	}
	ignore := g.depth == 0 || !g.txnDeletes
	switch n := g.rnd.IntN(8); {
	case n < 2:
		l := g.leaseID()
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(l)))
		desc += fmt.Sprintf(" lease=%d", l)
	case n == 2 && ignore:
		g.txnIgnores = true
		if g.rnd.IntN(4) != 0 {
			v = "" // else etcd's "value is provided"
		}
		opts = append(opts, clientv3.WithIgnoreValue())
		desc = fmt.Sprintf("put %s=%q ignore_value", k, v)
	case n == 3 && ignore:
		g.txnIgnores = true
		opts = append(opts, clientv3.WithIgnoreLease())
		desc += " ignore_lease"
		if g.rnd.IntN(4) == 0 {
			// With a lease: etcd's "lease is provided".
			opts = append(opts, clientv3.WithLease(clientv3.LeaseID(g.leaseID())))
			desc += " lease"
		}
	}
	return clientv3.OpPut(k, v, opts...), desc
}

func (g *gen) deleteOp() (clientv3.Op, string) {
	if g.depth > 0 && g.txnIgnores {
		return g.rangeOp()
	}
	g.txnDeletes = true
	k, opts, desc := g.keyRange()
	desc = "delete " + desc
	if g.rnd.IntN(2) == 0 {
		opts = append(opts, clientv3.WithPrevKV())
		desc += " prev_kv"
	}
	return clientv3.OpDelete(k, opts...), desc
}

func (g *gen) cmp() (clientv3.Cmp, string) {
	k := g.key()
	res := []string{"=", "!=", ">", "<"}[g.rnd.IntN(4)]
	var c clientv3.Cmp
	var desc string
	switch g.rnd.IntN(5) {
	case 0:
		v := g.value()
		c, desc = clientv3.Compare(clientv3.Value(k), res, v), fmt.Sprintf("value(%s)%s%q", k, res, v)
	case 1:
		v := g.rnd.Int64N(4)
		c, desc = clientv3.Compare(clientv3.Version(k), res, v), fmt.Sprintf("version(%s)%s%d", k, res, v)
	case 2:
		v := g.revision()
		c, desc = clientv3.Compare(clientv3.CreateRevision(k), res, v), fmt.Sprintf("create(%s)%s%d", k, res, v)
	case 3:
		v := g.revision()
		c, desc = clientv3.Compare(clientv3.ModRevision(k), res, v), fmt.Sprintf("mod(%s)%s%d", k, res, v)
	default:
		v := int64(0)
		if g.rnd.IntN(2) == 0 {
			v = g.leaseID()
		}
		c, desc = clientv3.Compare(clientv3.LeaseValue(k), res, v), fmt.Sprintf("lease(%s)%s%d", k, res, v)
	}
	switch g.rnd.IntN(6) {
	case 0:
		c, desc = c.WithPrefix(), desc+" prefix"
	case 1:
		end := g.key()
		c, desc = c.WithRange(end), desc+" to "+end
	}
	return c, desc
}

func (g *gen) txnParts() ([]clientv3.Cmp, []clientv3.Op, []clientv3.Op, string) {
	var cmps []clientv3.Cmp
	var descs []string
	for range g.rnd.IntN(3) {
		c, d := g.cmp()
		cmps, descs = append(cmps, c), append(descs, d)
	}
	branch := func() ([]clientv3.Op, string) {
		var ops []clientv3.Op
		var ds []string
		for range g.rnd.IntN(4) {
			o, d := g.txnOp()
			ops, ds = append(ops, o), append(ds, d)
		}
		return ops, strings.Join(ds, "; ")
	}
	then, td := branch()
	els, ed := branch()
	return cmps, then, els, fmt.Sprintf("txn if [%s] then [%s] else [%s]", strings.Join(descs, ", "), td, ed)
}

func (g *gen) txnOp() (clientv3.Op, string) {
	switch n := g.rnd.IntN(10); {
	case n < 3:
		return g.rangeOp()
	case n < 6:
		return g.putOp()
	case n < 8:
		return g.deleteOp()
	default:
		if g.depth >= 3 {
			return g.rangeOp()
		}
		g.depth++
		defer func() { g.depth-- }()
		cmps, then, els, desc := g.txnParts()
		return clientv3.OpTxn(cmps, then, els), "(" + desc + ")"
	}
}

// kvOp is an operation of the KV service, its answer rendered.
func (g *gen) kvOp(o clientv3.Op, desc string) op {
	return op{desc: desc, do: func(ctx context.Context, s *side) string {
		r, err := s.c.Do(ctx, o)
		if err != nil {
			return "error " + errText(err)
		}
		switch {
		case r.Get() != nil:
			return answer((*pb.RangeResponse)(r.Get()), nil, func(r *pb.RangeResponse) { hdr(r.Header) })
		case r.Put() != nil:
			return answer((*pb.PutResponse)(r.Put()), nil, func(r *pb.PutResponse) { hdr(r.Header) })
		case r.Del() != nil:
			return answer((*pb.DeleteRangeResponse)(r.Del()), nil, func(r *pb.DeleteRangeResponse) { hdr(r.Header) })
		default:
			return answer((*pb.TxnResponse)(r.Txn()), nil, normTxn)
		}
	}}
}

// next is the next operation.
func (g *gen) next() op {
	kvOp := g.kvOp
	switch n := g.rnd.IntN(100); {
	case n < 20:
		return kvOp(g.rangeOp())
	case n < 42:
		return kvOp(g.putOp())
	case n < 50:
		return kvOp(g.deleteOp())
	case n < 75:
		g.depth, g.txnDeletes, g.txnIgnores = 1, false, false
		cmps, then, els, desc := g.txnParts()
		g.depth = 0
		return kvOp(clientv3.OpTxn(cmps, then, els), desc)
	case n < 80:
		id, ttl := 1000+g.rnd.Int64N(8), 60+g.rnd.Int64N(120)
		return op{desc: fmt.Sprintf("lease grant id=%d ttl=%d", id, ttl), grant: id, do: func(ctx context.Context, s *side) string {
			r, err := s.lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: id, TTL: ttl})
			return answer(r, err, func(r *pb.LeaseGrantResponse) { hdr(r.Header) })
		}}
	case n < 84:
		id := g.leaseID()
		return op{desc: fmt.Sprintf("lease revoke id=%d", id), revoke: id, do: func(ctx context.Context, s *side) string {
			r, err := s.lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: id})
			return answer(r, err, func(r *pb.LeaseRevokeResponse) { hdr(r.Header) })
		}}
	case n < 88:
		id := g.leaseID()
		return op{desc: fmt.Sprintf("lease timetolive id=%d keys", id), do: func(ctx context.Context, s *side) string {
			r, err := s.lease.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: id, Keys: true})
			return answer(r, err, func(r *pb.LeaseTimeToLiveResponse) {
				hdr(r.Header)
				// What is left depends on when it was asked; that it is
				// within the granted TTL does not.
				if r.TTL > 0 && r.TTL <= r.GrantedTTL {
					r.TTL = 1
				}
				slices.SortFunc(r.Keys, func(a, b []byte) int { return strings.Compare(string(a), string(b)) })
			})
		}}
	case n < 90:
		return op{desc: "lease leases", do: func(ctx context.Context, s *side) string {
			r, err := s.lease.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
			return answer(r, err, func(r *pb.LeaseLeasesResponse) {
				hdr(r.Header)
				slices.SortFunc(r.Leases, func(a, b *pb.LeaseStatus) int { return int(a.ID - b.ID) })
			})
		}}
	case n < 96:
		r := g.revision()
		return op{desc: fmt.Sprintf("compact %d", r), compact: r, syncWatches: true, do: func(ctx context.Context, s *side) string {
			resp, err := s.c.Compact(ctx, r)
			return answer((*pb.CompactionResponse)(resp), err, func(r *pb.CompactionResponse) { hdr(r.Header) })
		}}
	default:
		return g.watchOp()
	}
}

// watchOp opens a watch on a random range from a random revision (with
// random filters and prev_kv), takes what it sends up to the current
// revision, and cancels it. Where that ends comes from etcd's watch of the
// whole keyspace (watchSpec.until): a progress notification cannot tell,
// since etcd 3.4 answers a progress request at once, before a historical
// watch has been sent its events.
func (g *gen) watchOp() op {
	k, opts, desc := g.keyRange()
	start := min(g.revision(), g.rev)
	if start > 0 && start == g.compacted {
		// Whether a watch from the compacted revision itself is sent a
		// deletion at that revision depends on how far etcd's background
		// compaction has got.
		if start < g.rev {
			start++
		} else {
			start--
		}
	}
	opts = append(opts, clientv3.WithRev(start))
	desc = fmt.Sprintf("watch %s from %d", desc, start)
	if g.rnd.IntN(2) == 0 {
		opts = append(opts, clientv3.WithPrevKV())
		desc += " prev_kv"
	}
	get := clientv3.OpGet(k, opts...)
	spec := &watchSpec{key: string(get.KeyBytes()), end: string(get.RangeBytes()), start: start, compacted: start > 0 && start < g.compacted}
	switch g.rnd.IntN(5) {
	case 0:
		opts = append(opts, clientv3.WithFilterPut())
		desc += " noput"
		spec.noPut = true
	case 1:
		opts = append(opts, clientv3.WithFilterDelete())
		desc += " nodelete"
		spec.noDelete = true
	}
	return op{desc: desc, watch: spec, syncWatches: true, do: func(ctx context.Context, s *side) string {
		w := clientv3.NewWatcher(s.c)
		defer w.Close()
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		wch := w.Watch(ctx, k, append(opts, clientv3.WithCreatedNotify())...)
		var out []string
		done := func() bool { return !spec.compacted && spec.until == 0 }
		for {
			select {
			case resp, ok := <-wch:
				if !ok {
					return strings.Join(append(out, "closed"), " | ")
				}
				for _, ev := range resp.Events {
					out = append(out, renderEvent(ev))
					if ev.Kv.ModRevision >= spec.until {
						done = func() bool { return !spec.compacted }
					}
				}
				if resp.Canceled || resp.Err() != nil {
					out = append(out, fmt.Sprintf("canceled compact_revision=%d err=%s", resp.CompactRevision, errText(resp.Err())))
					return strings.Join(out, " | ")
				}
				if done() {
					return strings.Join(out, " | ")
				}
			case <-ctx.Done():
				return strings.Join(append(out, fmt.Sprintf("(nothing more within 5s: waiting for revision %d or a cancel)", spec.until)), " | ")
			}
		}
	}}
}

// watchSpec is what a watch covers, and so what etcd's events say it
// must be sent.
type watchSpec struct {
	key, end        string
	start           int64
	noPut, noDelete bool
	compacted       bool  // it starts before the compacted revision: a cancel is due
	until           int64 // the revision of the last event due, 0 for none
}

// lastDue is the revision of the last event of log that w must be sent.
func (l *eventLog) lastDue(w *watchSpec) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last int64
	if w.start == 0 {
		return 0 // a watch from now is due nothing past
	}
	for _, e := range l.recs {
		in := e.key == w.key
		switch {
		case w.end == "\x00":
			in = e.key >= w.key
		case w.end != "":
			in = e.key >= w.key && e.key < w.end
		}
		if in && e.rev >= w.start && !(w.noPut && e.typ == mvccpb.PUT) && !(w.noDelete && e.typ == mvccpb.DELETE) {
			last = e.rev
		}
	}
	return last
}

// observe follows etcd's answer to o.
func (g *gen) observe(o op, out string) {
	if strings.HasPrefix(out, "error ") {
		g.errors[strings.TrimPrefix(out, "error ")]++
		return
	}
	if rest, ok := strings.CutPrefix(out, "header:<revision:"); ok {
		if r, err := strconv.ParseInt(strings.Fields(rest)[0], 10, 64); err == nil && r > g.rev {
			g.rev = r
		}
	}
	switch {
	case o.compact > 0:
		g.compacted = o.compact
	case o.grant != 0:
		g.leases = append(g.leases, o.grant)
	case o.revoke != 0:
		g.leases = slices.DeleteFunc(g.leases, func(id int64) bool { return id == o.revoke })
	}
}

// TestDifferentialCases runs fixed sequences, each a difference the
// random test once found, against etcd and Tenure: the same comparison,
// deterministic, one subtest (fresh servers) per case.
func TestDifferentialCases(t *testing.T) {
	kv := func(o clientv3.Op, desc string) op { return (&gen{}).kvOp(o, desc) }
	put, del, txn := clientv3.OpPut, clientv3.OpDelete, clientv3.OpTxn
	for _, tc := range []struct {
		name string
		ops  []op
	}{
		{"compact 0 on a store never compacted", []op{
			kv(put("a", "1"), "put a"),
			{desc: "compact 0", do: func(ctx context.Context, s *side) string {
				r, err := s.c.Compact(ctx, 0)
				return answer((*pb.CompactionResponse)(r), err, func(r *pb.CompactionResponse) { hdr(r.Header) })
			}},
		}},
		// etcd checks every put on the chosen path (lease, ignore_value,
		// ignore_lease) before any range's revision.
		{"txn: puts are checked before ranges", []op{
			kv(put("a", "1"), "put a"),
			kv(txn(nil, []clientv3.Op{clientv3.OpGet("a", clientv3.WithRev(100)), put("a", "2", clientv3.WithLease(999))}, nil),
				"txn then [range a rev=100; put a lease=999]"),
			kv(txn(nil, []clientv3.Op{clientv3.OpGet("a", clientv3.WithRev(100)), put("b", "", clientv3.WithIgnoreValue())}, nil),
				"txn then [range a rev=100; put b ignore_value]"),
		}},
		// A watch's prev_kv is the key at the revision before the event's,
		// as etcd reads it, not the version an earlier op of the same txn
		// wrote.
		{"watch prev_kv of a key put and deleted in one txn", []op{
			kv(put("a", "0"), "put a"),
			kv(put("a", "2"), "put a"),
			kv(txn(nil, []clientv3.Op{put("a", "3"), del("a", clientv3.WithFromKey())}, nil),
				"txn then [put a; delete from a]"),
			kv(txn(nil, []clientv3.Op{put("b", "1"), del("a", clientv3.WithFromKey())}, nil),
				"txn then [put b; delete from a]"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref, sut, ok := pair(t)
			sides := []*side{newSide(t, ref)}
			if ok {
				sides = append(sides, newSide(t, sut))
			}
			var rev int64
			for i, o := range tc.ops {
				var outs []string
				for _, s := range sides {
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					outs = append(outs, o.do(ctx, s))
					cancel()
				}
				if rest, ok := strings.CutPrefix(outs[0], "header:<revision:"); ok {
					rev, _ = strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
				}
				if len(outs) == 2 && outs[0] != outs[1] {
					t.Errorf("operation %d: %s\n  etcd:   %s\n  tenure: %s", i+1, o.desc, outs[0], outs[1])
				}
			}
			for _, s := range sides {
				s.all.waitFor(t, rev)
			}
			if len(sides) == 2 {
				want, got := sides[0].all.snapshot(), sides[1].all.snapshot()
				if !slices.Equal(want, got) {
					t.Errorf("the watch from revision 1 differs:\n  etcd:\n    %s\n  tenure:\n    %s",
						strings.Join(want, "\n    "), strings.Join(got, "\n    "))
				}
			}
		})
	}
}

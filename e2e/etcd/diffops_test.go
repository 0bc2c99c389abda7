//go:build linux

package etcd

import (
	"fmt"
	"strconv"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// The differential fuzzer's operations are data, not closures: a
// sequence can be printed as a script (one operation a line, bytes quoted
// with Go's %q), parsed back, cut down by the shrinker and replayed on
// fresh servers. What depends on the servers' state is named, not
// computed when the sequence is made: a revision is "cur-1" or
// "compacted+1", resolved from etcd's answers as the operation runs, and
// a lease the server picks an ID for is "auto3", each server's own ID for
// the lease that grant named so. A shrunk sequence keeps its meaning when
// the operations before one are dropped.
//
// The script form, one operation per line ('#' starts a comment):
//
//	range KEY [end=END | prefix | fromkey] [limit=N] [rev=REV] [sort=TARGET/ORDER]
//	      [serializable] [keys_only] [count_only] [min_mod=REV] [max_mod=REV]
//	      [min_create=REV] [max_create=REV]
//	put KEY VALUE [prev_kv] [ignore_value] [ignore_lease] [lease=LEASE]
//	delete KEY [end=END | prefix | fromkey] [prev_kv]
//	txn if(CMP, ...) then(OP; ...) else(OP; ...)
//	    CMP: TARGET(KEY [end=END | prefix | fromkey]) =|!=|>|< VALUE
//	    TARGET: value (VALUE a quoted string), version (a number),
//	    create, mod (a REV), lease (a LEASE); OP: range, put, delete, txn
//	compact REV [physical]
//	grant LEASE ttl=N
//	revoke LEASE | timetolive LEASE [keys] | keepalive LEASE | leases
//	watch W KEY [end=END | prefix | fromkey] from=REV [prev_kv] [noput] [nodelete] [id=N] [once] [on=V]
//	cancel W
//
// KEY, VALUE and END are Go-quoted byte strings; REV is a number, cur,
// cur+N, cur-N, compacted, compacted+N or compacted-N; LEASE is a
// number (an ID the client chooses) or autoN (the server chooses).

// operation is one step of a sequence.
type operation interface {
	// script is the operation's line in a script.
	script() string
	// run sends the operation to one side and renders its answer.
	run(x *runner, s *side) answer
	// simpler lists variants of the operation with one thing less, for
	// the shrinker; nil when there is nothing to take away.
	simpler() []operation
}

// --- revisions ---

// revBase is what a revision is counted from.
type revBase byte

const (
	revAbs       revBase = iota // a number
	revCur                      // etcd's current revision
	revCompacted                // the revision of the last successful compaction, 0 before any
)

// revRef is a revision as an operation names it.
type revRef struct {
	base revBase
	n    int64
}

func (r revRef) String() string {
	name := map[revBase]string{revCur: "cur", revCompacted: "compacted"}[r.base]
	switch {
	case r.base == revAbs:
		return strconv.FormatInt(r.n, 10)
	case r.n == 0:
		return name
	default:
		return fmt.Sprintf("%s%+d", name, r.n)
	}
}

// resolve is the revision r names in state st; never negative.
func (r revRef) resolve(st state) int64 {
	v := r.n
	switch r.base {
	case revCur:
		v += st.cur
	case revCompacted:
		v += st.compacted
	}
	return max(v, 0)
}

func parseRev(s string) (revRef, error) {
	for base, name := range map[revBase]string{revCur: "cur", revCompacted: "compacted"} {
		if rest, ok := strings.CutPrefix(s, name); ok {
			if rest == "" {
				return revRef{base: base}, nil
			}
			n, err := strconv.ParseInt(rest, 10, 64)
			if err != nil || (rest[0] != '+' && rest[0] != '-') {
				return revRef{}, fmt.Errorf("bad revision %q", s)
			}
			return revRef{base: base, n: n}, nil
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return revRef{}, fmt.Errorf("bad revision %q", s)
	}
	return revRef{n: n}, nil
}

// --- leases ---

// leaseRef is a lease as an operation names it: an ID the client chose,
// or the label of a grant that let the server choose (auto != "").
type leaseRef struct {
	id   int64
	auto string
}

func (l leaseRef) String() string {
	if l.auto != "" {
		return l.auto
	}
	return strconv.FormatInt(l.id, 10)
}

func (l leaseRef) zero() bool { return l == leaseRef{} }

func parseLease(s string) (leaseRef, error) {
	if strings.HasPrefix(s, "auto") {
		return leaseRef{auto: s}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return leaseRef{}, fmt.Errorf("bad lease %q", s)
	}
	return leaseRef{id: n}, nil
}

// --- key ranges ---

// rangeKind is how a key range is given.
type rangeKind byte

const (
	oneKey  rangeKind = iota // the key alone
	toEnd                    // [key, end)
	prefix                   // every key with key as prefix
	fromKey                  // every key from key on (range_end "\x00")
)

// keyRange is a key and, for a range, its end.
type keyRange struct {
	key  string
	end  string // for toEnd
	kind rangeKind
}

func (r keyRange) String() string {
	s := quote(r.key)
	switch r.kind {
	case toEnd:
		s += " end=" + quote(r.end)
	case prefix:
		s += " prefix"
	case fromKey:
		s += " fromkey"
	}
	return s
}

// bytes is the key and range_end a request carries.
func (r keyRange) bytes() (key, end []byte) {
	key = []byte(r.key)
	switch r.kind {
	case toEnd:
		end = []byte(r.end)
	case prefix:
		end = prefixEnd(key)
	case fromKey:
		end = []byte{0}
	}
	return key, end
}

// prefixEnd is the range end of every key that starts with p, as
// clientv3.GetPrefixRangeEnd computes it: p with its last byte below 0xff
// incremented and what follows dropped (a\xff → b, \xd0\xbf → \xd0\xc0),
// or "\x00" (every key from p on) when every byte is 0xff or p is empty.
func prefixEnd(p []byte) []byte {
	end := []byte(string(p))
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}

// contains tells whether key k is in r, as a watch or etcd's index
// decides it.
func (r keyRange) contains(k string) bool {
	key, end := r.bytes()
	switch {
	case len(end) == 0:
		return k == string(key)
	case len(end) == 1 && end[0] == 0:
		return k >= string(key)
	default:
		return k >= string(key) && k < string(end)
	}
}

// --- KV operations ---

// rangeOp is a Range request.
type rangeOp struct {
	r                                    keyRange
	limit                                int64
	rev                                  revRef
	sorted                               bool
	target                               pb.RangeRequest_SortTarget
	order                                pb.RangeRequest_SortOrder
	serializable, keysOnly, countOnly    bool
	minMod, maxMod, minCreate, maxCreate revRef
}

func (o *rangeOp) script() string {
	w := words{"range", o.r.String()}
	w.num("limit", o.limit)
	w.rev("rev", o.rev)
	if o.sorted {
		w = append(w, fmt.Sprintf("sort=%s/%s", o.target, o.order))
	}
	w.flag("serializable", o.serializable)
	w.flag("keys_only", o.keysOnly)
	w.flag("count_only", o.countOnly)
	w.rev("min_mod", o.minMod)
	w.rev("max_mod", o.maxMod)
	w.rev("min_create", o.minCreate)
	w.rev("max_create", o.maxCreate)
	return w.String()
}

func (o *rangeOp) request(st state) *pb.RangeRequest {
	key, end := o.r.bytes()
	return &pb.RangeRequest{
		Key: key, RangeEnd: end, Limit: o.limit, Revision: o.rev.resolve(st),
		SortOrder: o.order, SortTarget: o.target,
		Serializable: o.serializable, KeysOnly: o.keysOnly, CountOnly: o.countOnly,
		MinModRevision: o.minMod.resolve(st), MaxModRevision: o.maxMod.resolve(st),
		MinCreateRevision: o.minCreate.resolve(st), MaxCreateRevision: o.maxCreate.resolve(st),
	}
}

func (o *rangeOp) simpler() []operation {
	var out []operation
	try := func(change func(c *rangeOp)) {
		c := *o
		change(&c)
		if c != *o {
			out = append(out, &c)
		}
	}
	try(func(c *rangeOp) { c.r.kind = oneKey })
	try(func(c *rangeOp) { c.limit = 0 })
	try(func(c *rangeOp) { c.rev = revRef{} })
	try(func(c *rangeOp) { c.sorted, c.target, c.order = false, 0, 0 })
	try(func(c *rangeOp) { c.serializable = false })
	try(func(c *rangeOp) { c.keysOnly = false })
	try(func(c *rangeOp) { c.countOnly = false })
	try(func(c *rangeOp) {
		c.minMod, c.maxMod, c.minCreate, c.maxCreate = revRef{}, revRef{}, revRef{}, revRef{}
	})
	return out
}

// putOp is a Put request.
type putOp struct {
	key, value                       string
	prevKV, ignoreValue, ignoreLease bool
	lease                            leaseRef
}

func (o *putOp) script() string {
	w := words{"put", quote(o.key), quote(o.value)}
	w.flag("prev_kv", o.prevKV)
	w.flag("ignore_value", o.ignoreValue)
	w.flag("ignore_lease", o.ignoreLease)
	if !o.lease.zero() {
		w = append(w, "lease="+o.lease.String())
	}
	return w.String()
}

func (o *putOp) request(s *side) *pb.PutRequest {
	return &pb.PutRequest{
		Key: []byte(o.key), Value: []byte(o.value), Lease: s.leaseID(o.lease),
		PrevKv: o.prevKV, IgnoreValue: o.ignoreValue, IgnoreLease: o.ignoreLease,
	}
}

func (o *putOp) simpler() []operation {
	var out []operation
	try := func(change func(c *putOp)) {
		c := *o
		change(&c)
		if c != *o {
			out = append(out, &c)
		}
	}
	try(func(c *putOp) { c.prevKV = false })
	try(func(c *putOp) { c.ignoreValue = false })
	try(func(c *putOp) { c.ignoreLease = false })
	try(func(c *putOp) { c.lease = leaseRef{} })
	return out
}

// deleteOp is a DeleteRange request.
type deleteOp struct {
	r      keyRange
	prevKV bool
}

func (o *deleteOp) script() string {
	w := words{"delete", o.r.String()}
	w.flag("prev_kv", o.prevKV)
	return w.String()
}

func (o *deleteOp) request() *pb.DeleteRangeRequest {
	key, end := o.r.bytes()
	return &pb.DeleteRangeRequest{Key: key, RangeEnd: end, PrevKv: o.prevKV}
}

func (o *deleteOp) simpler() []operation {
	var out []operation
	if o.prevKV {
		out = append(out, &deleteOp{r: o.r})
	}
	if o.r.kind != oneKey {
		out = append(out, &deleteOp{r: keyRange{key: o.r.key}, prevKV: o.prevKV})
	}
	return out
}

// compare is one compare of a Txn.
type compare struct {
	target pb.Compare_CompareTarget
	r      keyRange
	result pb.Compare_CompareResult
	value  string   // VALUE
	n      int64    // VERSION
	rev    revRef   // CREATE, MOD
	lease  leaseRef // LEASE
}

var (
	targetNames = map[pb.Compare_CompareTarget]string{pb.Compare_VALUE: "value", pb.Compare_VERSION: "version", pb.Compare_CREATE: "create", pb.Compare_MOD: "mod", pb.Compare_LEASE: "lease"}
	resultNames = map[pb.Compare_CompareResult]string{pb.Compare_EQUAL: "=", pb.Compare_NOT_EQUAL: "!=", pb.Compare_GREATER: ">", pb.Compare_LESS: "<"}
)

func (c compare) String() string {
	var v string
	switch c.target {
	case pb.Compare_VALUE:
		v = quote(c.value)
	case pb.Compare_VERSION:
		v = strconv.FormatInt(c.n, 10)
	case pb.Compare_CREATE, pb.Compare_MOD:
		v = c.rev.String()
	case pb.Compare_LEASE:
		v = c.lease.String()
	}
	return fmt.Sprintf("%s(%s) %s %s", targetNames[c.target], c.r, resultNames[c.result], v)
}

func (c compare) pb(st state, s *side) *pb.Compare {
	key, end := c.r.bytes()
	p := &pb.Compare{Target: c.target, Key: key, RangeEnd: end, Result: c.result}
	switch c.target {
	case pb.Compare_VALUE:
		p.TargetUnion = &pb.Compare_Value{Value: []byte(c.value)}
	case pb.Compare_VERSION:
		p.TargetUnion = &pb.Compare_Version{Version: c.n}
	case pb.Compare_CREATE:
		p.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: c.rev.resolve(st)}
	case pb.Compare_MOD:
		p.TargetUnion = &pb.Compare_ModRevision{ModRevision: c.rev.resolve(st)}
	case pb.Compare_LEASE:
		p.TargetUnion = &pb.Compare_Lease{Lease: s.leaseID(c.lease)}
	}
	return p
}

// txnOp is a Txn request; its branches hold rangeOp, putOp, deleteOp and
// txnOp.
type txnOp struct {
	cmps      []compare
	then, els []operation
}

func (o *txnOp) script() string {
	cmps := make([]string, len(o.cmps))
	for i, c := range o.cmps {
		cmps[i] = c.String()
	}
	branch := func(ops []operation) string {
		s := make([]string, len(ops))
		for i, op := range ops {
			s[i] = op.script()
		}
		return strings.Join(s, "; ")
	}
	return fmt.Sprintf("txn if(%s) then(%s) else(%s)", strings.Join(cmps, ", "), branch(o.then), branch(o.els))
}

func (o *txnOp) request(st state, s *side) *pb.TxnRequest {
	r := &pb.TxnRequest{}
	for _, c := range o.cmps {
		r.Compare = append(r.Compare, c.pb(st, s))
	}
	branch := func(ops []operation) []*pb.RequestOp {
		var out []*pb.RequestOp
		for _, op := range ops {
			switch op := op.(type) {
			case *rangeOp:
				out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: op.request(st)}})
			case *putOp:
				out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: op.request(s)}})
			case *deleteOp:
				out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: op.request()}})
			case *txnOp:
				out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: op.request(st, s)}})
			}
		}
		return out
	}
	r.Success, r.Failure = branch(o.then), branch(o.els)
	return r
}

// simpler drops one compare or one operation, or simplifies one
// operation, of either branch at any depth.
func (o *txnOp) simpler() []operation {
	var out []operation
	for i := range o.cmps {
		c := *o
		c.cmps = append(append([]compare(nil), o.cmps[:i]...), o.cmps[i+1:]...)
		out = append(out, &c)
	}
	for _, b := range []int{0, 1} {
		ops := [][]operation{o.then, o.els}[b]
		with := func(ops []operation) operation {
			c := *o
			if b == 0 {
				c.then = ops
			} else {
				c.els = ops
			}
			return &c
		}
		for i := range ops {
			out = append(out, with(append(append([]operation(nil), ops[:i]...), ops[i+1:]...)))
		}
		for i, op := range ops {
			for _, s := range op.simpler() {
				changed := append([]operation(nil), ops...)
				changed[i] = s
				out = append(out, with(changed))
			}
		}
	}
	return out
}

// compactOp is a Compact request.
type compactOp struct {
	rev      revRef
	physical bool
}

func (o *compactOp) script() string {
	w := words{"compact", o.rev.String()}
	w.flag("physical", o.physical)
	return w.String()
}

func (o *compactOp) simpler() []operation {
	if o.physical {
		return []operation{&compactOp{rev: o.rev}}
	}
	return nil
}

// --- leases ---

// grantOp is a LeaseGrant of lease (ID 0 when it is an auto one).
type grantOp struct {
	lease leaseRef
	ttl   int64
}

func (o *grantOp) script() string     { return fmt.Sprintf("grant %s ttl=%d", o.lease, o.ttl) }
func (*grantOp) simpler() []operation { return nil }

// leaseOp is a LeaseRevoke, LeaseTimeToLive (keys or not), one
// LeaseKeepAlive, or LeaseLeases (which names no lease).
type leaseOp struct {
	verb  string // revoke, timetolive, keepalive, leases
	lease leaseRef
	keys  bool
}

func (o *leaseOp) script() string {
	if o.verb == "leases" {
		return "leases"
	}
	w := words{o.verb, o.lease.String()}
	w.flag("keys", o.keys)
	return w.String()
}

func (o *leaseOp) simpler() []operation {
	if o.keys {
		return []operation{&leaseOp{verb: o.verb, lease: o.lease}}
	}
	return nil
}

// --- watches ---

// watchOp opens watch number w on a stream of its own, or on watch on's
// when that is open and the watch does not start in the compacted past. A once watch takes what it is due up to the current
// revision and is cancelled in the same step; any other stays open until
// a cancel names it or the sequence ends.
type watchOp struct {
	w                       int
	r                       keyRange
	from                    revRef
	prevKV, noPut, noDelete bool
	id                      int64 // watch_id the client asks for; 0 lets the server pick
	once                    bool
	on                      int // open it on the stream of this watch, if open; 0 for a stream of its own
}

func (o *watchOp) script() string {
	w := words{"watch", strconv.Itoa(o.w), o.r.String(), "from=" + o.from.String()}
	w.flag("prev_kv", o.prevKV)
	w.flag("noput", o.noPut)
	w.flag("nodelete", o.noDelete)
	w.num("id", o.id)
	w.flag("once", o.once)
	w.num("on", int64(o.on))
	return w.String()
}

func (o *watchOp) simpler() []operation {
	var out []operation
	try := func(change func(c *watchOp)) {
		c := *o
		change(&c)
		if c != *o {
			out = append(out, &c)
		}
	}
	try(func(c *watchOp) { c.prevKV = false })
	try(func(c *watchOp) { c.noPut, c.noDelete = false, false })
	try(func(c *watchOp) { c.id = 0 })
	try(func(c *watchOp) { c.on = 0 })
	try(func(c *watchOp) { c.r.kind = oneKey })
	return out
}

// cancelOp cancels watch number w.
type cancelOp struct{ w int }

func (o *cancelOp) script() string     { return fmt.Sprintf("cancel %d", o.w) }
func (*cancelOp) simpler() []operation { return nil }

// --- printing ---

// words is a script line being put together.
type words []string

func (w *words) flag(name string, on bool) {
	if on {
		*w = append(*w, name)
	}
}

func (w *words) num(name string, n int64) {
	if n != 0 {
		*w = append(*w, fmt.Sprintf("%s=%d", name, n))
	}
}

func (w *words) rev(name string, r revRef) {
	if r != (revRef{}) {
		*w = append(*w, name+"="+r.String())
	}
}

func (w words) String() string { return strings.Join(w, " ") }

// script is a sequence as a script, one numbered line an operation when
// numbered (a comment to the parser), else plain.
func script(ops []operation, numbered bool) string {
	var b strings.Builder
	for i, o := range ops {
		if numbered {
			fmt.Fprintf(&b, "%3d  ", i+1)
		}
		b.WriteString(o.script())
		b.WriteByte('\n')
	}
	return b.String()
}

// quote is s as Go's %q writes it, except that U+FFFD (the replacement
// character, what a decoder puts where bytes were not UTF-8) is written
// \ufffd, so that it cannot pass for the bytes it replaced.
func quote(s string) string {
	return strings.ReplaceAll(strconv.Quote(s), "\uFFFD", `\ufffd`)
}

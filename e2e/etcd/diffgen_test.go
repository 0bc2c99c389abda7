//go:build linux

package etcd

import (
	"math/rand/v2"
	"slices"
	"strconv"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// keyPool is where a seed's key space comes from, besides random bytes:
// the bytes that UTF-8 and range ends turn on. 0x00, 0x7f, a lone
// continuation byte (0xbf), 0xff; invalid sequences (c3 28, a truncated
// e6 97, a surrogate ed a0 80); multi-byte UTF-8; and keys whose prefix
// end carries: a\xff → b, \xff\xff → every key from it on (range_end
// "\x00"), п (d0 bf) → d0 c0, which is not UTF-8.
var keyPool = []string{
	"a", "a\x00", "a\xff", "a\xff\xff", "ab", "b",
	"\x00", "\x00\x00", "\x01", "\x7f", "\xbf", "\xc0\x80", "\xff", "\xff\xfe", "\xff\xff", "\xff\xff\x00",
	"п", "пр", "пример", "рыба", "\xd0", "\xd0\xc0", "日本", "\xe6\x97",
	"\xc3\x28", "\xed\xa0\x80", "/u/п", "/u/рыба", "/u/zebra",
}

// valuePool is where values come from, besides random bytes.
var valuePool = []string{
	"", "", "\x00", "\x7f", "\xbf", "\xff", "\xff\xfe", "п", "日本", "v", "\xc3\x28", "\xed\xa0\x80",
}

// alphabet is what random keys and values are made of.
const alphabet = "\x00\x01ab\x7f\x80\xbf\xc0\xd0\xe6\xfe\xff"

// Explicit lease IDs are firstLeaseID and the seven after it: far above
// the revisions Tenure names the leases it picks IDs for, so that a
// client's choice cannot collide with them in a run of operations.
const firstLeaseID = 100001

// gen makes the random operations of one seed. It follows nothing the
// servers answer: the sequence is a function of the seed alone, and what
// depends on the servers' state is named (revRef, leaseRef) and resolved
// as it runs.
type gen struct {
	rnd    *rand.Rand
	keys   []string
	leases []leaseRef // every lease a grant so far named
	autos  int        // auto leases named so far
	nextW  int        // the next watch number
	open   []int      // long-lived watches not cancelled yet
	depth  int        // of the txn being made; 0 outside txns
	// A txn being made has deletes, or puts with ignore_value or
	// ignore_lease, never both: a delete followed by such a put of the
	// same key in one txn passes etcd's checks, fails at apply, and etcd
	// (3.4 and 3.5 alike) panics ("unexpected error during txn").
	txnDeletes, txnIgnores bool
}

// generate is the sequence of n operations of seed.
func generate(seed uint64, n int) []operation {
	g := &gen{rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), nextW: 1}
	g.keys = g.keySpace()
	ops := make([]operation, 0, n)
	for len(ops) < n {
		ops = append(ops, g.next())
	}
	return ops
}

// keySpace is six to ten distinct keys, some from keyPool, some random
// bytes, some an earlier key with a byte added. Never more than twelve:
// etcd sorts a range's keys with sort.Sort, which is stable only below
// thirteen elements, and keys that tie on the sort target must come out
// in one order.
func (g *gen) keySpace() []string {
	n := 6 + g.rnd.IntN(5)
	var keys []string
	for len(keys) < n {
		var k string
		switch r := g.rnd.IntN(10); {
		case r < 5 || len(keys) == 0:
			k = keyPool[g.rnd.IntN(len(keyPool))]
		case r < 7:
			k = g.bytes(1 + g.rnd.IntN(3))
		default:
			k = keys[g.rnd.IntN(len(keys))] + g.bytes(1)
		}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// bytes is n random bytes of the alphabet.
func (g *gen) bytes(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[g.rnd.IntN(len(alphabet))]
	}
	return string(b)
}

func (g *gen) key() string { return g.keys[g.rnd.IntN(len(g.keys))] }

func (g *gen) value() string {
	switch r := g.rnd.IntN(10); {
	case r < 5:
		return valuePool[g.rnd.IntN(len(valuePool))]
	case r < 9:
		return g.bytes(1 + g.rnd.IntN(4))
	default:
		// 16 random bytes, as the lock recipes of etcd's Python and Node
		// clients store a binary UUID.
		b := make([]byte, 16)
		for i := range b {
			b[i] = byte(g.rnd.IntN(256))
		}
		return string(b)
	}
}

// keyRange is one key (half the time), a prefix of a key (now and then
// the empty one, which etcd refuses), [key, end) with end another key or
// prefix (so sometimes backwards), or every key from one on (now and
// then from "\x00": every key).
func (g *gen) keyRange() keyRange {
	k := g.key()
	switch g.rnd.IntN(8) {
	case 0, 1:
		p := k[:g.rnd.IntN(len(k)+1)]
		if p == "" && g.rnd.IntN(8) != 0 {
			p = k
		}
		return keyRange{key: p, kind: prefix}
	case 2:
		end := g.key()
		if g.rnd.IntN(3) == 0 {
			end = end[:g.rnd.IntN(len(end)+1)]
		}
		return keyRange{key: k, end: end, kind: toEnd}
	case 3:
		if g.rnd.IntN(4) == 0 {
			return keyRange{key: "\x00", kind: fromKey} // every key
		}
		return keyRange{key: k, kind: fromKey}
	default:
		return keyRange{key: k}
	}
}

// revision is a revision around the interesting ones: latest, current,
// just before, future, compacted and either side of it, or small.
func (g *gen) revision() revRef {
	switch g.rnd.IntN(12) {
	case 0, 1, 2:
		return revRef{}
	case 3:
		return revRef{base: revCur}
	case 4, 5, 6:
		return revRef{base: revCur, n: -1 - g.rnd.Int64N(4)}
	case 7:
		return revRef{base: revCur, n: 1 + g.rnd.Int64N(2)}
	case 8:
		return revRef{base: revCompacted}
	case 9:
		return revRef{base: revCompacted, n: -1}
	case 10:
		return revRef{base: revCompacted, n: 1}
	default:
		return revRef{n: 1 + g.rnd.Int64N(6)}
	}
}

// lease is a lease some grant named (which may have been revoked or have
// failed), or now and then an ID nobody granted.
func (g *gen) lease() leaseRef {
	if len(g.leases) == 0 || g.rnd.IntN(5) == 0 {
		return leaseRef{id: firstLeaseID + g.rnd.Int64N(8)}
	}
	return g.leases[g.rnd.IntN(len(g.leases))]
}

func (g *gen) rangeOp() operation {
	o := &rangeOp{r: g.keyRange()}
	if g.rnd.IntN(3) == 0 {
		o.limit = g.rnd.Int64N(4)
	}
	if g.rnd.IntN(3) == 0 {
		o.rev = g.revision()
	}
	if g.rnd.IntN(3) == 0 {
		o.sorted = true
		o.target = pb.RangeRequest_SortTarget(g.rnd.IntN(5))
		o.order = pb.RangeRequest_SortOrder(g.rnd.IntN(3))
	}
	o.serializable = g.rnd.IntN(4) == 0
	switch g.rnd.IntN(6) {
	case 0:
		o.keysOnly = true
	case 1:
		o.countOnly = true
	}
	if g.rnd.IntN(5) == 0 {
		r := g.revision()
		switch g.rnd.IntN(4) {
		case 0:
			o.minMod = r
		case 1:
			o.maxMod = r
		case 2:
			o.minCreate = r
		default:
			o.maxCreate = r
		}
	}
	return o
}

func (g *gen) putOp() operation {
	o := &putOp{key: g.key(), value: g.value(), prevKV: g.rnd.IntN(2) == 0}
	ignore := g.depth == 0 || !g.txnDeletes
	switch n := g.rnd.IntN(8); {
	case n < 2:
		o.lease = g.lease()
	case n == 2 && ignore:
		g.txnIgnores = true
		o.ignoreValue = true
		if g.rnd.IntN(4) != 0 {
			o.value = "" // else etcd's "value is provided"
		}
	case n == 3 && ignore:
		g.txnIgnores = true
		o.ignoreLease = true
		if g.rnd.IntN(4) == 0 {
			o.lease = g.lease() // etcd's "lease is provided"
		}
	}
	return o
}

func (g *gen) deleteOp() operation {
	if g.depth > 0 && g.txnIgnores {
		return g.rangeOp()
	}
	g.txnDeletes = true
	return &deleteOp{r: g.keyRange(), prevKV: g.rnd.IntN(2) == 0}
}

func (g *gen) compare() compare {
	c := compare{
		target: pb.Compare_CompareTarget(g.rnd.IntN(5)),
		r:      keyRange{key: g.key()},
		result: pb.Compare_CompareResult(g.rnd.IntN(4)),
	}
	switch c.target {
	case pb.Compare_VALUE:
		c.value = g.value()
	case pb.Compare_VERSION:
		c.n = g.rnd.Int64N(4)
	case pb.Compare_CREATE, pb.Compare_MOD:
		c.rev = g.revision()
	case pb.Compare_LEASE:
		// = and != only: which of two IDs is the greater depends on the
		// IDs the servers picked for their auto leases.
		c.result = pb.Compare_CompareResult(g.rnd.IntN(2) * int(pb.Compare_NOT_EQUAL))
		if g.rnd.IntN(2) == 0 {
			c.lease = g.lease()
		}
	}
	if g.rnd.IntN(3) == 0 {
		c.r = g.keyRange()
	}
	return c
}

// txn is a txn of up to two compares and up to three operations a
// branch, nested up to three deep.
func (g *gen) txn() *txnOp {
	o := &txnOp{}
	for range g.rnd.IntN(3) {
		o.cmps = append(o.cmps, g.compare())
	}
	for range g.rnd.IntN(4) {
		o.then = append(o.then, g.txnMember())
	}
	for range g.rnd.IntN(4) {
		o.els = append(o.els, g.txnMember())
	}
	return o
}

func (g *gen) txnMember() operation {
	switch n := g.rnd.IntN(20); {
	case n < 7:
		return g.rangeOp()
	case n < 13:
		return g.putOp()
	case n < 17:
		return g.deleteOp()
	default:
		if g.depth >= 3 {
			return g.rangeOp()
		}
		g.depth++
		defer func() { g.depth-- }()
		return g.txn()
	}
}

// emptyKey is a request with an empty key, which etcd refuses.
func (g *gen) emptyKey() operation {
	switch g.rnd.IntN(4) {
	case 0:
		return &putOp{key: "", value: g.value()}
	case 1:
		return &deleteOp{r: keyRange{key: ""}}
	case 2:
		return &rangeOp{r: keyRange{key: ""}}
	default:
		return &txnOp{then: []operation{&putOp{key: "", value: g.value()}}}
	}
}

// bigTxn is a txn of 128 ranges, etcd's --max-txn-ops, or one more,
// which etcd refuses.
func (g *gen) bigTxn() operation {
	o := &txnOp{}
	for range 128 + g.rnd.IntN(2) {
		o.then = append(o.then, &rangeOp{r: keyRange{key: g.key()}, countOnly: true})
	}
	return o
}

func (g *gen) compactOp() operation {
	var r revRef
	switch g.rnd.IntN(10) {
	case 0, 1, 2:
		r = revRef{base: revCur}
	case 3, 4, 5:
		r = revRef{base: revCur, n: -1 - g.rnd.Int64N(3)}
	case 6:
		r = revRef{base: revCompacted} // etcd: compacted, or 0 on a fresh store
	case 7:
		r = revRef{base: revCompacted, n: -1}
	case 8:
		r = revRef{base: revCur, n: 1} // a future revision
	default:
		r = revRef{}
	}
	return &compactOp{rev: r, physical: g.rnd.IntN(3) == 0}
}

func (g *gen) grantOp() operation {
	o := &grantOp{ttl: 600 + g.rnd.Int64N(3000)}
	if g.rnd.IntN(2) == 0 {
		o.lease = leaseRef{id: firstLeaseID + g.rnd.Int64N(8)}
	} else {
		g.autos++
		o.lease = leaseRef{auto: "auto" + strconv.Itoa(g.autos)}
	}
	if g.rnd.IntN(30) == 0 {
		o.ttl = 9_000_000_001 // above etcd's maximum
	}
	g.leases = append(g.leases, o.lease)
	return o
}

// watchOp is a watch of a random range. A once watch starts anywhere up
// to the current revision (in the compacted past too); one left open
// starts now or at a future revision, so that it is among etcd's synced
// watchers from the start: a compaction while etcd still replays a
// historical watch would cancel it or not depending on timing.
func (g *gen) watchOp(once bool) operation {
	o := &watchOp{w: g.nextW, r: g.keyRange(), prevKV: g.rnd.IntN(2) == 0, once: once}
	g.nextW++
	if once {
		o.from = g.revision()
	} else if g.rnd.IntN(2) == 0 {
		o.from = revRef{base: revCur, n: 1 + g.rnd.Int64N(3)}
	}
	switch g.rnd.IntN(11) {
	case 0, 1:
		o.noPut = true
	case 2, 3:
		o.noDelete = true
	case 4:
		o.noPut, o.noDelete = true, true
	}
	if g.rnd.IntN(5) == 0 {
		o.id = g.rnd.Int64N(4) // 0 lets the server pick; a watch already open on the stream may have it
	}
	if len(g.open) > 0 && g.rnd.IntN(2) == 0 {
		o.on = g.open[g.rnd.IntN(len(g.open))]
	}
	if !once {
		g.open = append(g.open, o.w)
	}
	return o
}

// next is the next top-level operation.
func (g *gen) next() operation {
	g.depth, g.txnDeletes, g.txnIgnores = 0, false, false
	switch n := g.rnd.IntN(100); {
	case n < 18:
		return g.rangeOp()
	case n < 38:
		return g.putOp()
	case n < 45:
		return g.deleteOp()
	case n < 67:
		g.depth = 1
		defer func() { g.depth = 0 }()
		return g.txn()
	case n < 71:
		return g.grantOp()
	case n < 74:
		return &leaseOp{verb: "revoke", lease: g.lease()}
	case n < 77:
		return &leaseOp{verb: "timetolive", lease: g.lease(), keys: g.rnd.IntN(3) != 0}
	case n < 78:
		return &leaseOp{verb: "keepalive", lease: g.lease()}
	case n < 79:
		return &leaseOp{verb: "leases"}
	case n < 84:
		return g.compactOp()
	case n < 90:
		return g.watchOp(true)
	case n < 94:
		if len(g.open) >= 3 {
			return g.rangeOp()
		}
		return g.watchOp(false)
	case n < 97:
		if len(g.open) == 0 {
			return g.putOp()
		}
		i := g.rnd.IntN(len(g.open))
		w := g.open[i]
		g.open = slices.Delete(g.open, i, i+1)
		return &cancelOp{w: w}
	case n < 98:
		if g.rnd.IntN(4) == 0 {
			return g.bigTxn()
		}
		return g.emptyKey()
	default:
		return g.putOp()
	}
}

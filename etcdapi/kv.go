package etcdapi

import (
	"context"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/statemachine"
)

// kvServer is etcd's KV service. Every write is a statemachine.Txn (a Put
// or a DeleteRange is a Txn of one operation) proposed through the
// Backend; reads, and Txns that write nothing, run on Backend.Read. It
// validates requests as etcd's v3rpc layer does, before anything reaches
// the log, so that a bad request changes nothing.
type kvServer struct {
	pb.UnimplementedKVServer
	b Backend
	// maxAnswer caps the bytes of one answer's keys and values
	// (answerBudget).
	maxAnswer int64
}

func newKV(b Backend) *kvServer { return &kvServer{b: b, maxAnswer: maxResponseBytes(b)} }

// kvPB is the etcd form of a key. Its lease is the etcd lease ID of the
// session the key is bound to, which a client may have chosen.
func kvPB(kv *statemachine.KeyValue) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{
		Key:            []byte(kv.Key),
		Value:          []byte(kv.Value),
		CreateRevision: kv.CreateRevision,
		ModRevision:    kv.ModRevision,
		Version:        kv.Version,
		Lease:          kv.EtcdLease(),
	}
}

func (s *kvServer) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if len(r.Key) == 0 {
		return nil, rpctypes.ErrGRPCEmptyKey
	}
	if err := s.b.Authorize(ctx, VerbRead, string(r.Key), string(r.RangeEnd)); err != nil {
		return nil, toGRPC(err)
	}
	budget := newAnswerBudget(s.maxAnswer)
	c := newRangeCollector(r, budget)
	var rev int64
	err := s.b.Read(ctx, r.Serializable, func(m *statemachine.Machine) error {
		rev = m.KVRevision()
		return m.RangeKeys(string(r.Key), string(r.RangeEnd), r.Revision, c.add)
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	resp := c.response()
	if budget.over() {
		return nil, budget.err()
	}
	resp.Header = header(s.b, rev)
	return resp, nil
}

// rangeCollector turns the keys in a RangeRequest's range, given in key
// order, into its response, as etcd's applier does: count is every key in
// the range at the revision, before the min/max filters; with a sort
// order or a filter every key is read and the limit cut after sorting and
// filtering; otherwise only limit+1 keys are kept (the one extra tells
// `more`), and a sort target without an order sorts just those, ascending.
//
// It keeps the state machine's KeyValues, whose bytes it shares, and
// converts only those the answer sends, after counting their bytes
// against the answer's budget: nothing is converted once the budget is
// spent. Without a limit every key kept is sent, so it counts as it
// reads and stops keeping keys once the budget is spent; with one, the
// keys sent are known once sorted, and it counts them then.
type rangeCollector struct {
	r       *pb.RangeRequest
	budget  *answerBudget
	keepAll bool
	kvs     []statemachine.KeyValue
	count   int64
}

func newRangeCollector(r *pb.RangeRequest, budget *answerBudget) *rangeCollector {
	return &rangeCollector{
		r:      r,
		budget: budget,
		keepAll: r.Limit <= 0 || r.SortOrder != pb.RangeRequest_NONE ||
			r.MinModRevision != 0 || r.MaxModRevision != 0 ||
			r.MinCreateRevision != 0 || r.MaxCreateRevision != 0,
	}
}

// add takes the next key of the range; it always returns true, for
// RangeKeys, since every key counts.
func (c *rangeCollector) add(kv statemachine.KeyValue) bool {
	c.count++
	r := c.r
	switch {
	case r.CountOnly,
		!c.keepAll && int64(len(c.kvs)) > r.Limit,
		r.MaxModRevision != 0 && kv.ModRevision > r.MaxModRevision,
		r.MinModRevision != 0 && kv.ModRevision < r.MinModRevision,
		r.MaxCreateRevision != 0 && kv.CreateRevision > r.MaxCreateRevision,
		r.MinCreateRevision != 0 && kv.CreateRevision < r.MinCreateRevision:
		return true
	}
	if r.Limit <= 0 {
		// Sent, whatever the order: counted now, and kept only
		// while the answer may still be built.
		c.budget.take(&kv, r.KeysOnly)
		if !c.budget.building() {
			c.kvs = nil
			return true
		}
	}
	c.kvs = append(c.kvs, kv)
	return true
}

// response is the RangeResponse, without its header, or nil when the
// budget is spent (then the caller answers budget.err()) or only sizing.
func (c *rangeCollector) response() *pb.RangeResponse {
	r := c.r
	kvs := c.kvs
	order := r.SortOrder
	if order == pb.RangeRequest_NONE && r.SortTarget != pb.RangeRequest_KEY {
		order = pb.RangeRequest_ASCEND
	}
	// Past the budget the keys are only counted, and those sent
	// without a limit are all of them, in any order.
	if less := kvLess(r.SortTarget); order != pb.RangeRequest_NONE && less != nil && (r.Limit > 0 || c.budget.building()) {
		// sort.Sort with etcd's Less, not a stable sort: keys that tie
		// come out in the order etcd gives them.
		var sorter sort.Interface = kvSorter{kvs, less}
		if order == pb.RangeRequest_DESCEND {
			sorter = sort.Reverse(sorter)
		}
		sort.Sort(sorter)
	}
	resp := &pb.RangeResponse{Count: c.count}
	if r.Limit > 0 && int64(len(kvs)) > r.Limit {
		kvs, resp.More = kvs[:r.Limit], true
	}
	if r.Limit > 0 {
		for i := range kvs {
			c.budget.take(&kvs[i], r.KeysOnly)
		}
	}
	if !c.budget.building() {
		return nil
	}
	resp.Kvs = make([]*mvccpb.KeyValue, len(kvs))
	for i := range kvs {
		kv := kvs[i]
		if r.KeysOnly {
			kv.Value = "" // not copied to be dropped
		}
		resp.Kvs[i] = kvPB(&kv)
		if r.KeysOnly {
			resp.Kvs[i].Value = nil
		}
	}
	return resp
}

func kvLess(t pb.RangeRequest_SortTarget) func(a, b *statemachine.KeyValue) bool {
	switch t {
	case pb.RangeRequest_KEY:
		return func(a, b *statemachine.KeyValue) bool { return a.Key < b.Key }
	case pb.RangeRequest_VERSION:
		return func(a, b *statemachine.KeyValue) bool { return a.Version < b.Version }
	case pb.RangeRequest_CREATE:
		return func(a, b *statemachine.KeyValue) bool { return a.CreateRevision < b.CreateRevision }
	case pb.RangeRequest_MOD:
		return func(a, b *statemachine.KeyValue) bool { return a.ModRevision < b.ModRevision }
	case pb.RangeRequest_VALUE:
		return func(a, b *statemachine.KeyValue) bool { return a.Value < b.Value }
	}
	return nil
}

type kvSorter struct {
	kvs  []statemachine.KeyValue
	less func(a, b *statemachine.KeyValue) bool
}

func (s kvSorter) Len() int           { return len(s.kvs) }
func (s kvSorter) Less(i, j int) bool { return s.less(&s.kvs[i], &s.kvs[j]) }
func (s kvSorter) Swap(i, j int)      { s.kvs[i], s.kvs[j] = s.kvs[j], s.kvs[i] }

func (s *kvServer) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := checkPut(r); err != nil {
		return nil, err
	}
	if err := s.authorizePut(ctx, r); err != nil {
		return nil, toGRPC(err)
	}
	res, err := s.b.Propose(ctx, statemachine.Txn{Success: []statemachine.TxnOp{putOp(r)}})
	if err != nil {
		return nil, toGRPC(err)
	}
	resp := &pb.PutResponse{Header: header(s.b, res.KVRevision)}
	if prev := res.Txn.Ops[0].PrevKV; r.PrevKv && prev != nil {
		resp.PrevKv = kvPB(prev)
	}
	return resp, nil
}

func (s *kvServer) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if len(r.Key) == 0 {
		return nil, rpctypes.ErrGRPCEmptyKey
	}
	if err := s.authorizeDelete(ctx, r); err != nil {
		return nil, toGRPC(err)
	}
	res, err := s.b.Propose(ctx, statemachine.Txn{Success: []statemachine.TxnOp{deleteOp(r)}})
	if err != nil {
		return nil, toGRPC(err)
	}
	budget := newAnswerBudget(s.maxAnswer)
	resp := deleteResponse(r, &res.Txn.Ops[0], budget)
	if budget.over() {
		// Deleted all the same, as etcd deletes a range whose answer
		// gRPC then refuses to send.
		return nil, budget.err()
	}
	resp.Header = header(s.b, res.KVRevision)
	return resp, nil
}

func (s *kvServer) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := checkTxn(r, maxTxnOps); err != nil {
		return nil, err
	}
	// After checkTxn, as etcd does, so that a huge request is refused
	// before the quadratic check.
	if _, _, err := checkIntervals(r.Success); err != nil {
		return nil, err
	}
	if _, _, err := checkIntervals(r.Failure); err != nil {
		return nil, err
	}
	if err := s.authorizeTxn(ctx, r); err != nil {
		return nil, toGRPC(err)
	}
	t := txnOf(r)
	if !t.Writes() {
		var (
			res *statemachine.TxnResponse
			rev int64
		)
		err := s.b.Read(ctx, txnSerializable(r), func(m *statemachine.Machine) error {
			var err error
			rev = m.KVRevision()
			res, err = m.ReadTxn(t)
			return err
		})
		if err != nil {
			return nil, toGRPC(err)
		}
		resp, err := s.txnAnswer(r, res, txnRevs{begin: rev})
		if err != nil {
			return nil, err
		}
		resp.Header = header(s.b, rev)
		return resp, nil
	}
	res, err := s.b.Propose(ctx, t)
	if err != nil {
		return nil, toGRPC(err)
	}
	revs := txnRevs{begin: res.KVRevision}
	if txnChanged(r, res.Txn) {
		revs.begin--
	}
	resp, err := s.txnAnswer(r, res.Txn, revs)
	if err != nil {
		// Applied all the same, as etcd applies a Txn whose answer
		// gRPC then refuses to send.
		return nil, err
	}
	resp.Header = header(s.b, res.KVRevision)
	return resp, nil
}

func (s *kvServer) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	// etcd lets only an admin compact; here, whoever may write every key.
	if err := s.b.Authorize(ctx, VerbWrite, "\x00", "\x00"); err != nil {
		return nil, toGRPC(err)
	}
	// Physical needs nothing more: the versions are gone once it applies.
	res, err := s.b.Propose(ctx, statemachine.Compact{Revision: r.Revision})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.CompactionResponse{Header: header(s.b, res.KVRevision)}, nil
}

// checkPut is etcd's checkPutRequest. A key and a value have no bound
// of their own, as in etcd: the request that carries them has
// (ServerOptions).
func checkPut(r *pb.PutRequest) error {
	switch {
	case len(r.Key) == 0:
		return rpctypes.ErrGRPCEmptyKey
	case r.IgnoreValue && len(r.Value) != 0:
		return rpctypes.ErrGRPCValueProvided
	case r.IgnoreLease && r.Lease != 0:
		return rpctypes.ErrGRPCLeaseProvided
	}
	return nil
}

// checkTxn is etcd's checkTxnRequest, but for how operations count: no
// more than max compares and operations over every level of the Txn
// (txnOps), where etcd bounds each level alone.
func checkTxn(r *pb.TxnRequest, max int) error {
	if txnOps(r, max) > max {
		return rpctypes.ErrGRPCTooManyOps
	}
	return checkTxnFields(r)
}

// checkTxnFields checks what etcd's checkTxnRequest checks of each
// compare and operation, nested ones included.
func checkTxnFields(r *pb.TxnRequest) error {
	for _, c := range r.Compare {
		if len(c.Key) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
		if _, ok := cmpOps[c.Result]; !ok {
			return status.Errorf(codes.InvalidArgument, "etcdserver: unknown compare result %d", c.Result)
		}
		if _, ok := cmpTargets[c.Target]; !ok {
			return status.Errorf(codes.InvalidArgument, "etcdserver: unknown compare target %d", c.Target)
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if err := checkOp(op); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkOp is etcd's checkRequestOp: an operation that is none of the
// four is answered "key not found", as etcd answers it.
func checkOp(op *pb.RequestOp) error {
	switch u := op.GetRequest().(type) {
	case *pb.RequestOp_RequestRange:
		if len(u.RequestRange.GetKey()) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	case *pb.RequestOp_RequestPut:
		if u.RequestPut == nil {
			return rpctypes.ErrGRPCEmptyKey
		}
		return checkPut(u.RequestPut)
	case *pb.RequestOp_RequestDeleteRange:
		if len(u.RequestDeleteRange.GetKey()) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	case *pb.RequestOp_RequestTxn:
		if u.RequestTxn == nil {
			return rpctypes.ErrGRPCKeyNotFound
		}
		return checkTxnFields(u.RequestTxn)
	default:
		return rpctypes.ErrGRPCKeyNotFound
	}
	return nil
}

// interval is a deleted range as etcd's checkIntervals sees it:
// [begin, end), compared as plain strings, so that a range end of "\x00"
// (every key from begin on) covers no key there, as in etcd.
type interval struct{ begin, end string }

type intervals []interval

func (ivs intervals) contains(key string) bool {
	for _, iv := range ivs {
		if iv.begin <= key && key < iv.end {
			return true
		}
	}
	return false
}

// checkIntervals is etcd's rule against duplicate keys in a Txn, ported
// from its v3rpc/key.go: within one list of operations, and the branches
// of the Txns nested in it, a key may not be put twice, nor put and
// deleted; the two branches of one nested Txn may put the same key, as
// only one of them runs. It returns the keys put and ranges deleted, for
// the level above.
func checkIntervals(ops []*pb.RequestOp) (map[string]struct{}, intervals, error) {
	var dels intervals
	for _, op := range ops {
		d := op.GetRequestDeleteRange()
		if d == nil {
			continue
		}
		if len(d.RangeEnd) != 0 {
			dels = append(dels, interval{string(d.Key), string(d.RangeEnd)})
		} else {
			dels = append(dels, interval{string(d.Key), string(d.Key) + "\x00"})
		}
	}
	puts := map[string]struct{}{}
	for _, op := range ops {
		t := op.GetRequestTxn()
		if t == nil {
			continue
		}
		putsThen, delsThen, err := checkIntervals(t.Success)
		if err != nil {
			return nil, dels, err
		}
		putsElse, delsElse, err := checkIntervals(t.Failure)
		if err != nil {
			return nil, dels, err
		}
		for k := range putsThen {
			if _, ok := puts[k]; ok || dels.contains(k) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		for k := range putsElse {
			if _, ok := puts[k]; ok {
				if _, inThen := putsThen[k]; !inThen {
					return nil, dels, rpctypes.ErrGRPCDuplicateKey
				}
			}
			if dels.contains(k) {
				return nil, dels, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		dels = append(append(dels, delsThen...), delsElse...)
	}
	for _, op := range ops {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.Key)
		if _, ok := puts[k]; ok || dels.contains(k) {
			return nil, dels, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = struct{}{}
	}
	return puts, dels, nil
}

// txnSerializable is etcd's isTxnSerializable: every operation of both
// branches is a serializable range (a nested Txn makes it linearizable).
func txnSerializable(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if rr := op.GetRequestRange(); rr == nil || !rr.Serializable {
				return false
			}
		}
	}
	return true
}

// authorizePut checks what etcd's checkPutAuth checks: write on the key,
// read on it for prev_kv, and, with a policy, write on every key already
// attached to the lease (who may not revoke the lease may not attach to
// it).
func (s *kvServer) authorizePut(ctx context.Context, r *pb.PutRequest) error {
	if err := s.b.Authorize(ctx, VerbWrite, string(r.Key), ""); err != nil {
		return err
	}
	if r.Lease != 0 && s.b.AuthEnabled() {
		if err := authorizeLeaseKeys(ctx, s.b, r.Lease); err != nil {
			return err
		}
	}
	if r.PrevKv {
		return s.b.Authorize(ctx, VerbRead, string(r.Key), "")
	}
	return nil
}

// authorizeLeaseKeys checks that the caller may write every key attached
// to etcd lease id, as etcd's checkLeasePuts does; a lease that is gone
// has none.
func authorizeLeaseKeys(ctx context.Context, b Backend, id int64) error {
	var keys []string
	err := b.Read(ctx, true, func(m *statemachine.Machine) error {
		if sess, ok := m.SessionByLease(id); ok {
			keys = m.SessionKeys(sess.ID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := b.Authorize(ctx, VerbWrite, k, ""); err != nil {
			return err
		}
	}
	return nil
}

func (s *kvServer) authorizeDelete(ctx context.Context, r *pb.DeleteRangeRequest) error {
	if err := s.b.Authorize(ctx, VerbWrite, string(r.Key), string(r.RangeEnd)); err != nil {
		return err
	}
	if r.PrevKv {
		return s.b.Authorize(ctx, VerbRead, string(r.Key), string(r.RangeEnd))
	}
	return nil
}

// authorizeTxn is etcd's checkTxnAuth: read on every compare's range, and
// each operation of both branches as if it were sent alone.
func (s *kvServer) authorizeTxn(ctx context.Context, r *pb.TxnRequest) error {
	for _, c := range r.Compare {
		if err := s.b.Authorize(ctx, VerbRead, string(c.Key), string(c.RangeEnd)); err != nil {
			return err
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			var err error
			switch u := op.GetRequest().(type) {
			case *pb.RequestOp_RequestRange:
				err = s.b.Authorize(ctx, VerbRead, string(u.RequestRange.Key), string(u.RequestRange.RangeEnd))
			case *pb.RequestOp_RequestPut:
				err = s.authorizePut(ctx, u.RequestPut)
			case *pb.RequestOp_RequestDeleteRange:
				err = s.authorizeDelete(ctx, u.RequestDeleteRange)
			case *pb.RequestOp_RequestTxn:
				err = s.authorizeTxn(ctx, u.RequestTxn)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

var cmpOps = map[pb.Compare_CompareResult]statemachine.CmpOp{
	pb.Compare_EQUAL:     statemachine.CmpEqual,
	pb.Compare_GREATER:   statemachine.CmpGreater,
	pb.Compare_LESS:      statemachine.CmpLess,
	pb.Compare_NOT_EQUAL: statemachine.CmpNotEqual,
}

var cmpTargets = map[pb.Compare_CompareTarget]statemachine.TxnTarget{
	pb.Compare_VERSION: statemachine.TargetVersion,
	pb.Compare_CREATE:  statemachine.TargetCreate,
	pb.Compare_MOD:     statemachine.TargetMod,
	pb.Compare_VALUE:   statemachine.TargetValue,
	pb.Compare_LEASE:   statemachine.TargetLease,
}

// txnOf converts a checked TxnRequest. A compare's operand is the one of
// its target; another one set in its place counts as zero, as in etcd.
func txnOf(r *pb.TxnRequest) statemachine.Txn {
	t := statemachine.Txn{
		Compares: make([]statemachine.TxnCompare, 0, len(r.Compare)),
		Success:  opsOf(r.Success),
		Failure:  opsOf(r.Failure),
	}
	for _, c := range r.Compare {
		tc := statemachine.TxnCompare{
			Key: string(c.Key), End: string(c.RangeEnd),
			Target: cmpTargets[c.Target], Op: cmpOps[c.Result],
		}
		switch c.Target {
		case pb.Compare_VERSION:
			tc.Number = c.GetVersion()
		case pb.Compare_CREATE:
			tc.Number = c.GetCreateRevision()
		case pb.Compare_MOD:
			tc.Number = c.GetModRevision()
		case pb.Compare_LEASE:
			tc.Number = c.GetLease()
		case pb.Compare_VALUE:
			tc.Value = string(c.GetValue())
		}
		t.Compares = append(t.Compares, tc)
	}
	return t
}

func opsOf(ops []*pb.RequestOp) []statemachine.TxnOp {
	out := make([]statemachine.TxnOp, 0, len(ops))
	for _, op := range ops {
		switch u := op.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			out = append(out, statemachine.TxnOp{
				Type: statemachine.OpRange, Key: string(u.RequestRange.Key),
				End: string(u.RequestRange.RangeEnd), Revision: u.RequestRange.Revision,
			})
		case *pb.RequestOp_RequestPut:
			out = append(out, putOp(u.RequestPut))
		case *pb.RequestOp_RequestDeleteRange:
			out = append(out, deleteOp(u.RequestDeleteRange))
		case *pb.RequestOp_RequestTxn:
			t := txnOf(u.RequestTxn)
			out = append(out, statemachine.TxnOp{Type: statemachine.OpTxn, Txn: &t})
		}
	}
	return out
}

func putOp(r *pb.PutRequest) statemachine.TxnOp {
	return statemachine.TxnOp{
		Type: statemachine.OpPut, Key: string(r.Key), Value: string(r.Value), Lease: r.Lease,
		IgnoreValue: r.IgnoreValue, IgnoreLease: r.IgnoreLease,
	}
}

func deleteOp(r *pb.DeleteRangeRequest) statemachine.TxnOp {
	return statemachine.TxnOp{Type: statemachine.OpDelete, Key: string(r.Key), End: string(r.RangeEnd)}
}

// deleteResponse answers a DeleteRange; its prev_kvs count against
// budget, and are left out once it is spent.
func deleteResponse(r *pb.DeleteRangeRequest, res *statemachine.TxnOpResult, budget *answerBudget) *pb.DeleteRangeResponse {
	resp := &pb.DeleteRangeResponse{Deleted: int64(len(res.PrevKVs))}
	if !r.PrevKv {
		return resp
	}
	for i := range res.PrevKVs {
		budget.take(&res.PrevKVs[i], false)
	}
	if !budget.building() {
		return resp
	}
	resp.PrevKvs = make([]*mvccpb.KeyValue, len(res.PrevKVs))
	for i := range res.PrevKVs {
		resp.PrevKvs[i] = kvPB(&res.PrevKVs[i])
	}
	return resp
}

// txnChanged reports whether the operations of r that ran (res) changed
// a key: a put always does, a delete when it found something.
func txnChanged(r *pb.TxnRequest, res *statemachine.TxnResponse) bool {
	reqs := r.Success
	if !res.Succeeded {
		reqs = r.Failure
	}
	for i, req := range reqs {
		switch u := req.GetRequest().(type) {
		case *pb.RequestOp_RequestPut:
			return true
		case *pb.RequestOp_RequestDeleteRange:
			if len(res.Ops[i].PrevKVs) > 0 {
				return true
			}
		case *pb.RequestOp_RequestTxn:
			if txnChanged(u.RequestTxn, res.Ops[i].Txn) {
				return true
			}
		}
	}
	return false
}

// txnAnswer is the answer of Txn r that ran as res, counted whole before
// any of it is built: its Ranges' keys are converted one Range at a
// time, so a first pass sizes them all, and only an answer within the
// cap is built. Else it is etcd's clients' error for an answer too
// large.
func (s *kvServer) txnAnswer(r *pb.TxnRequest, res *statemachine.TxnResponse, revs txnRevs) (*pb.TxnResponse, error) {
	sizing := &answerBudget{max: s.maxAnswer, sizing: true}
	counted := revs
	txnResponse(r, res, &counted, sizing)
	if sizing.over() {
		return nil, sizing.err()
	}
	return txnResponse(r, res, &revs, newAnswerBudget(s.maxAnswer)), nil
}

// txnRevs follows the revision a Txn's operations see, for the headers of
// their responses: etcd gives each the revision of its write transaction
// at that point — begin until the first change, begin+1 from it on.
type txnRevs struct {
	begin   int64
	changed bool
}

func (v *txnRevs) now() int64 {
	if v.changed {
		return v.begin + 1
	}
	return v.begin
}

// txnResponse builds the response of the branch that ran, each operation
// answered as etcd answers it alone. The operations' headers hold only a
// revision, and a nested Txn's none, as in etcd; the caller sets the
// outer header. Every Range's keys and every prev_kv count against one
// budget; once it is spent the rest is only counted, and the caller
// answers budget.err() instead.
func txnResponse(r *pb.TxnRequest, res *statemachine.TxnResponse, revs *txnRevs, budget *answerBudget) *pb.TxnResponse {
	reqs := r.Success
	if !res.Succeeded {
		reqs = r.Failure
	}
	resp := &pb.TxnResponse{Succeeded: res.Succeeded, Responses: make([]*pb.ResponseOp, len(reqs))}
	for i, req := range reqs {
		op := &res.Ops[i]
		switch u := req.GetRequest().(type) {
		case *pb.RequestOp_RequestRange:
			c := newRangeCollector(u.RequestRange, budget)
			for _, kv := range op.KVs {
				c.add(kv)
			}
			rr := c.response()
			if rr == nil {
				continue // the budget is spent: only counting
			}
			rr.Header = &pb.ResponseHeader{Revision: revs.now()}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: rr}}
		case *pb.RequestOp_RequestPut:
			revs.changed = true
			pr := &pb.PutResponse{Header: &pb.ResponseHeader{Revision: revs.now()}}
			if u.RequestPut.PrevKv && op.PrevKV != nil && budget.take(op.PrevKV, false) && budget.building() {
				pr.PrevKv = kvPB(op.PrevKV)
			}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: pr}}
		case *pb.RequestOp_RequestDeleteRange:
			dr := deleteResponse(u.RequestDeleteRange, op, budget)
			revs.changed = revs.changed || dr.Deleted > 0
			dr.Header = &pb.ResponseHeader{Revision: revs.now()}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: dr}}
		case *pb.RequestOp_RequestTxn:
			tr := txnResponse(u.RequestTxn, op.Txn, revs, budget)
			tr.Header = &pb.ResponseHeader{}
			resp.Responses[i] = &pb.ResponseOp{Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: tr}}
		}
	}
	return resp
}

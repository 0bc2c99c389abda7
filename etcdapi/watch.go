package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// A Watch stream serves its watches from two sources that join exactly.
// The past comes from the state machine's history of keys
// (Machine.KeyEvents), read under one Backend.Read together with the
// global revision G the state was at; the present comes from the node's
// event hub, followed from G+1. Key events carry both clocks: the hub
// orders them by global revision, and a watch skips what it already got
// by KV revision, so a key event reaches a watch once, whichever source
// brings it.
//
// One hub watcher serves every watch of a stream, and one goroutine (the
// handler's) owns the stream: it reads requests, catches watches up,
// turns hub events into responses and sends them. A second goroutine
// only calls the hub watcher's Next when the owner asks, one call at a
// time, so that the owner can select on it beside requests and timers
// and knows where the hub watcher stands between calls.

// Etcd's texts for refused watches (go.etcd.io/etcd/server/v3/mvcc).
var (
	errWatchDuplicateID = errors.New("mvcc: duplicate watch ID provided on the WatchStream")
	errWatchEmptyRange  = errors.New("mvcc: watcher range is empty")
)

const (
	// defaultProgressInterval is etcd's --experimental-watch-progress-notify-interval.
	defaultProgressInterval = 10 * time.Minute
	// defaultMaxResponseBytes is the size past which etcd splits the
	// response of a watch that asked for fragments: its default
	// --max-request-bytes (1.5 MiB) plus its allowance for gRPC overhead.
	defaultMaxResponseBytes = 3<<20/2 + 512<<10
	// maxBatchRevisions bounds the KV revisions in one response of a
	// watch catching up, as etcd's watchBatchMaxRevs does.
	maxBatchRevisions = 1000
	// maxReplayScan bounds the events of history one Backend.Read looks
	// at, so that a watch from long ago that matches few of them does not
	// hold up the node's applies while it reads; the next read goes on
	// where this one stopped.
	maxReplayScan = 10000
)

// watchServer serves etcd's Watch service.
type watchServer struct {
	pb.UnimplementedWatchServer
	b Backend
	// progressInterval is how often a watch created with progress_notify
	// that got no events since the last time hears the current revision;
	// etcd adds up to a tenth of it at random, and so do we.
	progressInterval time.Duration
	// maxResponseBytes: a response of a watch created with fragment is
	// split into responses no bigger, as etcd does.
	maxResponseBytes int
}

func newWatch(b Backend) *watchServer {
	return &watchServer{b: b, progressInterval: defaultProgressInterval, maxResponseBytes: defaultMaxResponseBytes}
}

// Watch serves one stream until the client ends it or the node stops.
// As etcd does, the client closing its side (io.EOF) ends nothing: its
// watches keep sending until the stream's context ends.
func (s *watchServer) Watch(gs pb.Watch_WatchServer) error {
	st := &watchStream{
		srv:     s,
		b:       s.b,
		gs:      gs,
		ctx:     gs.Context(),
		watches: map[int64]*watcher{},
		reqc:    make(chan nextRequest),
		resc:    make(chan nextResult, 1),
	}
	st.ranges.Store(&[]keyRange{})
	st.wg.Add(1)
	go st.readLoop()
	defer st.close()

	// Recv cannot be selected on: this goroutine hands requests over,
	// and ends when the stream does, which the handler returning causes.
	recvc := make(chan *pb.WatchRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := gs.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case recvc <- req:
			case <-st.ctx.Done():
				return
			}
		}
	}()

	ticker := time.NewTicker(s.progressInterval + time.Duration(rand.Int64N(int64(s.progressInterval)/10+1)))
	defer ticker.Stop()
	for {
		if err := st.idle(); err != nil {
			return streamError(err)
		}
		st.askNext()
		var err error
		select {
		case req := <-recvc:
			err = st.handle(req)
		case err = <-recvErr:
			if err == io.EOF {
				err = nil
			}
		case res := <-st.resc:
			st.asked = false
			err = st.took(res)
		case <-ticker.C:
			err = st.tick()
		case <-st.ctx.Done():
			err = st.ctx.Err()
		case <-s.b.Done():
			return rpctypes.ErrGRPCStopped
		}
		if err != nil {
			return streamError(err)
		}
	}
}

// streamError is what a stream that fails with err ends with, as etcd's
// Watch answers it.
func streamError(err error) error {
	if errors.Is(err, context.Canceled) {
		return rpctypes.ErrGRPCWatchCanceled
	}
	return toGRPC(err)
}

// keyRange is the keys a watch covers: key alone when end is "", every
// key from key on when all is set, else [key, end).
type keyRange struct {
	key, end string
	all      bool
}

// end is the range end as etcd names it, for Backend.Authorize.
func (r keyRange) rangeEnd() string {
	if r.all {
		return "\x00"
	}
	return r.end
}

func (r keyRange) contains(k string) bool {
	switch {
	case r.all:
		return k >= r.key
	case r.end == "":
		return k == r.key
	}
	return k >= r.key && k < r.end
}

// watcher is one watch of a stream; only the stream's goroutine uses it.
type watcher struct {
	id int64
	// release gives back the watch's slot of the caller's and the node's
	// open watches (Backend.HoldWatch).
	release func()
	keys    keyRange
	start   int64 // the start_revision asked for
	// next is the first KV revision the watch has not been given.
	next           int64
	prevKV         bool
	fragment       bool
	progressNotify bool
	noPut          bool
	noDelete       bool
	// quiet is set by each progress tick and cleared by events: a watch
	// still quiet at the next tick is sent the revision (etcd's
	// serverWatchStream.progress).
	quiet bool

	pending []*mvccpb.Event // the events of the response being built
	// Catch-up bookkeeping of one history read.
	revs      int   // KV revisions in pending
	lastRev   int64 // KV revision of the last event counted in revs
	more      int64 // where the next read resumes, when the batch filled up
	compacted int64 // the compact revision, when the history it is owed is gone
}

// event is e as this watch reports it, or nil when a filter drops it.
// compact is the compact revision when e comes from the history: etcd
// looks prev_kv up at the revision before e and finds nothing there once
// that is compacted.
func (w *watcher) event(e *statemachine.Event, compact int64) *mvccpb.Event {
	ev := &mvccpb.Event{Type: mvccpb.PUT, Kv: kvPB(e.KV)}
	if e.Type != statemachine.EventKeyPut {
		ev.Type = mvccpb.DELETE
	}
	if ev.Type == mvccpb.PUT && w.noPut || ev.Type == mvccpb.DELETE && w.noDelete {
		return nil
	}
	created := ev.Type == mvccpb.PUT && e.KV.CreateRevision == e.KV.ModRevision
	if w.prevKV && e.PrevKV != nil && !created && e.KV.ModRevision-1 >= compact {
		ev.PrevKv = kvPB(e.PrevKV)
	}
	return ev
}

// nextRequest asks the reader goroutine for the hub watcher's next event.
type nextRequest struct {
	w   *watch.Watcher
	ctx context.Context
}

type nextResult struct {
	ev  statemachine.Event
	err error
}

// progressWant is a progress response at KV revision rev, owed once the
// stream has reached its target: then no event of a KV revision up to
// rev is still to come.
type progressWant struct {
	id  int64 // the watch, or clientv3.InvalidWatchID for all of them
	rev int64
}

type watchStream struct {
	srv *watchServer
	b   Backend
	gs  pb.Watch_WatchServer
	ctx context.Context

	watches map[int64]*watcher
	nextID  int64 // the next ID to try for a watch the server names

	// hub is the hub watcher the stream's watches share; nil while the
	// stream has none. Its filter runs on the reader goroutine under the
	// hub's lock, so what it reads is atomic and never behind a lock
	// that is held across a Backend call.
	hub       *watch.Watcher
	ranges    atomic.Pointer[[]keyRange] // what the filter accepts; replaced, never changed
	marker    atomic.Int64               // the filter also accepts the event of this global revision
	scanned   atomic.Int64               // the last global revision the filter looked at
	scannedKV atomic.Int64               // the KV revision of the last key event it looked at

	reqc    chan nextRequest
	resc    chan nextResult
	wg      sync.WaitGroup // the reader goroutine
	asked   bool           // a Next is under way
	nextCtx context.Context
	cancel  context.CancelFunc // cancels nextCtx

	// batchRev is the KV revision of the live events in the watches'
	// pending lists, 0 when there are none. A KV revision's events are
	// sent together: the batch goes out when an event of a later one
	// arrives, or when the stream has looked at every event up to
	// target, a global revision read after the batch began, by which
	// the command that made it had certainly been published in full.
	batchRev int64
	target   int64 // 0: no flush point set
	progress []progressWant
}

// readLoop runs the hub watcher's Next calls the owner asks for.
func (st *watchStream) readLoop() {
	defer st.wg.Done()
	for req := range st.reqc {
		ev, err := req.w.Next(req.ctx)
		st.resc <- nextResult{ev: ev, err: err}
	}
}

// askNext starts a Next on the reader goroutine, unless one is under way
// or the stream has no watches.
func (st *watchStream) askNext() {
	if st.asked || st.hub == nil {
		return
	}
	// One context serves every Next until an interrupt cancels it.
	if st.nextCtx == nil {
		st.nextCtx, st.cancel = context.WithCancel(st.ctx)
	}
	st.asked = true
	st.reqc <- nextRequest{w: st.hub, ctx: st.nextCtx}
}

// interrupt ends the Next under way, if any, and handles what it got.
// Between Next calls the owner knows where the hub watcher stands
// (scanned), and may move the marker without it being passed unseen.
func (st *watchStream) interrupt() error {
	if !st.asked {
		return nil
	}
	st.cancel()
	st.nextCtx = nil
	res := <-st.resc
	st.asked = false
	return st.took(res)
}

func (st *watchStream) close() {
	if st.nextCtx != nil {
		st.cancel()
	}
	if st.asked {
		<-st.resc
	}
	close(st.reqc)
	st.wg.Wait()
	if st.hub != nil {
		st.hub.Close()
	}
	for _, w := range st.watches {
		w.release()
	}
}

// filter is the hub watcher's: key events in some watch's range, and the
// marker.
func (st *watchStream) filter(e *statemachine.Event) bool {
	st.scanned.Store(e.Revision)
	if e.Type.IsKey() && e.KV != nil {
		st.scannedKV.Store(e.KV.ModRevision)
		for _, r := range *st.ranges.Load() {
			if r.contains(e.KV.Key) {
				return true
			}
		}
	}
	return e.Revision == st.marker.Load()
}

func (st *watchStream) setRanges() {
	rs := make([]keyRange, 0, len(st.watches))
	for _, w := range st.watches {
		rs = append(rs, w.keys)
	}
	st.ranges.Store(&rs)
}

// revisions reads the current KV and global revisions of this node.
func (st *watchStream) revisions() (kvRev, global int64, err error) {
	err = st.b.Read(st.ctx, true, func(m *statemachine.Machine) error {
		kvRev, global = m.KVRevision(), m.Revision()
		return nil
	})
	return kvRev, global, err
}

func (st *watchStream) handle(req *pb.WatchRequest) error {
	switch u := req.RequestUnion.(type) {
	case *pb.WatchRequest_CreateRequest:
		if u.CreateRequest != nil {
			return st.create(u.CreateRequest)
		}
	case *pb.WatchRequest_CancelRequest:
		if u.CancelRequest != nil {
			return st.cancelWatch(u.CancelRequest.WatchId)
		}
	case *pb.WatchRequest_ProgressRequest:
		if u.ProgressRequest != nil {
			return st.requestProgress(-1)
		}
	}
	return nil
}

// refuse answers a create request that makes no watch, as etcd does:
// created and canceled at once, with no watch ID and the reason.
func (st *watchStream) refuse(reason string) error {
	rev, _, err := st.revisions()
	if err != nil {
		return err
	}
	return st.send(&pb.WatchResponse{
		Header: header(st.b, rev), WatchId: -1, Created: true, Canceled: true, CancelReason: reason,
	}, false)
}

func (st *watchStream) create(cr *pb.WatchCreateRequest) error {
	key := string(cr.Key)
	if key == "" {
		key = "\x00"
	}
	if cr.StartRevision < 0 {
		return st.refuse(rpctypes.ErrCompacted.Error())
	}
	if err := st.b.Authorize(st.ctx, VerbRead, key, string(cr.RangeEnd)); err != nil {
		if errors.Is(err, context.Canceled) {
			return err
		}
		return st.refuse(toGRPC(err).Error())
	}
	w := &watcher{
		keys:           keyRange{key: key, end: string(cr.RangeEnd)},
		start:          cr.StartRevision,
		prevKV:         cr.PrevKv,
		fragment:       cr.Fragment,
		progressNotify: cr.ProgressNotify,
		quiet:          true,
	}
	if w.keys.end == "\x00" {
		w.keys = keyRange{key: key, all: true}
	}
	if w.keys.end != "" && key >= w.keys.end {
		return st.refuse(errWatchEmptyRange.Error())
	}
	for _, f := range cr.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			w.noPut = true
		case pb.WatchCreateRequest_NODELETE:
			w.noDelete = true
		}
	}
	if cr.WatchId == 0 { // clientv3.AutoWatchID
		for st.watches[st.nextID] != nil {
			st.nextID++
		}
		w.id = st.nextID
		st.nextID++
	} else if st.watches[cr.WatchId] != nil {
		return st.refuse(errWatchDuplicateID.Error())
	} else {
		w.id = cr.WatchId
	}
	// Each watch holds a slot of the caller's and the node's open
	// watches, as a native watch does; a refusal names the limit.
	release, err := st.b.HoldWatch(st.ctx)
	if errors.Is(err, frontend.ErrLimit) {
		return st.refuse("etcdserver: too many watches: " + err.Error())
	}
	if err != nil {
		return st.refuse(toGRPC(err).Error())
	}
	w.release = release

	// A watch from a revision is answered as of every write acknowledged
	// before it, wherever it was made: above all a compaction, after
	// which etcd cancels a watch from before it (its compacted response)
	// on any member. A follower may not have applied it yet.
	if cr.StartRevision > 0 {
		st.b.Sync(st.ctx)
	}
	// Added before the history is read, so that the hub watcher's filter
	// takes every event after that read.
	st.watches[w.id] = w
	st.setRanges()
	w.next = cr.StartRevision // 0 until the read says what "now" is
	r, err := st.replayAndFollow([]*watcher{w}, func(m *statemachine.Machine) {
		if w.next == 0 {
			w.next = m.KVRevision() + 1
		}
	})
	if err != nil {
		return err
	}
	if err := st.send(&pb.WatchResponse{Header: header(st.b, r.rev), WatchId: w.id, Created: true}, false); err != nil {
		return err
	}
	return st.catchUp([]*watcher{w}, r)
}

// replayAndFollow is replayRound, after which the stream follows the hub
// from the revision read, if it does not yet. Should the hub have lost
// that revision already, the round is read again.
func (st *watchStream) replayAndFollow(ws []*watcher, before func(*statemachine.Machine)) (round, error) {
	nexts := make([]int64, len(ws))
	for i, w := range ws {
		nexts[i] = w.next
	}
	for {
		r, err := st.replayRound(ws, before)
		if err != nil || st.hub != nil {
			return r, err
		}
		hw, err := st.b.Watch(r.global+1, st.filter)
		if errors.Is(err, watch.ErrCompacted) {
			for i, w := range ws {
				w.next, w.compacted = nexts[i], 0
			}
			continue
		}
		if err != nil {
			return r, err
		}
		st.hub = hw
		st.scanned.Store(r.global)
		st.scannedKV.Store(r.rev)
		st.marker.Store(0)
		st.target = 0
		return r, nil
	}
}

// round is what one read of the history saw.
type round struct {
	rev, global, compact int64
}

// replayRound reads, under one Backend.Read, the history each of ws is
// owed from its next revision on, up to maxBatchRevisions KV revisions
// each, into their pending lists. A watch whose history is compacted
// gets compacted set; one whose batch filled up, or that the read
// stopped short of the end for, gets more. before, if
// set, runs first under the same read.
func (st *watchStream) replayRound(ws []*watcher, before func(*statemachine.Machine)) (round, error) {
	var r round
	err := st.b.Read(st.ctx, true, func(m *statemachine.Machine) error {
		if before != nil {
			before(m)
		}
		r = round{rev: m.KVRevision(), global: m.Revision(), compact: m.CompactRevision()}
		var active []*watcher
		from := int64(math.MaxInt64)
		for _, w := range ws {
			w.pending, w.revs, w.lastRev, w.more = nil, 0, 0, 0
			switch {
			case w.next > r.rev:
			case w.next < r.compact:
				w.compacted = r.compact
			default:
				active = append(active, w)
				from = min(from, w.next)
			}
		}
		if len(active) == 0 {
			return nil
		}
		full, scanned, prevRev := 0, 0, int64(0)
		return m.KeyEvents(from, func(e statemachine.Event) bool {
			rev := e.KV.ModRevision
			if scanned >= maxReplayScan && rev != prevRev {
				for _, w := range active {
					if w.more == 0 {
						w.more = rev
					}
				}
				return false
			}
			scanned++
			prevRev = rev
			for _, w := range active {
				if w.more != 0 || rev < w.next || !w.keys.contains(e.KV.Key) {
					continue
				}
				if rev != w.lastRev {
					if w.revs == maxBatchRevisions {
						w.more = rev
						full++
						continue
					}
					w.revs++
					w.lastRev = rev
				}
				if ev := w.event(&e, r.compact); ev != nil {
					w.pending = append(w.pending, ev)
				}
			}
			return full < len(active)
		})
	})
	if err != nil {
		return r, err
	}
	for _, w := range ws {
		switch {
		case w.compacted != 0:
		case w.more != 0:
			w.next = w.more
		case w.next <= r.rev:
			w.next = r.rev + 1
		}
	}
	return r, nil
}

// catchUp sends ws what replayRound r read for them, and reads on until
// each is level with the history. A watch whose history is compacted is
// cancelled with the compact revision, as etcd does (its header
// revision is 0 there too).
func (st *watchStream) catchUp(ws []*watcher, r round) error {
	for {
		var more []*watcher
		for _, w := range ws {
			switch {
			case w.compacted != 0:
				if err := st.send(&pb.WatchResponse{
					Header: header(st.b, 0), WatchId: w.id, CompactRevision: w.compacted, Canceled: true,
				}, false); err != nil {
					return err
				}
				st.remove(w.id)
				continue
			case len(w.pending) > 0:
				// As etcd answers a watcher that catches up: all it is
				// owed in one response, at the current revision.
				ended, err := st.sendEvents(w, r.rev, w.pending)
				if err != nil {
					return err
				}
				if ended {
					continue
				}
				w.pending, w.quiet = nil, false
			}
			if w.more != 0 {
				more = append(more, w)
			}
		}
		if len(more) == 0 {
			return nil
		}
		var err error
		ws = more
		if r, err = st.replayRound(ws, nil); err != nil {
			return err
		}
	}
}

// sendEvents sends w its events, if the caller still reads w's keys by
// the policy in force now: a watch whose read was revoked after it was
// made is cancelled with the refusal instead, as the native API ends a
// watch, and ended reports that. The credential itself is checked on
// every message the stream sends (the server's stream interceptor);
// this is the check of what it reads.
func (st *watchStream) sendEvents(w *watcher, rev int64, evs []*mvccpb.Event) (ended bool, err error) {
	if err := st.b.Authorize(st.ctx, VerbRead, w.keys.key, w.keys.rangeEnd()); err != nil {
		if errors.Is(err, context.Canceled) {
			return true, err
		}
		st.remove(w.id)
		return true, st.send(&pb.WatchResponse{
			Header: header(st.b, rev), WatchId: w.id, Canceled: true, CancelReason: toGRPC(err).Error(),
		}, false)
	}
	return false, st.send(&pb.WatchResponse{Header: header(st.b, rev), WatchId: w.id, Events: evs}, w.fragment)
}

// remove forgets watch id and its owed progress.
func (st *watchStream) remove(id int64) {
	if w := st.watches[id]; w != nil {
		w.release()
	}
	delete(st.watches, id)
	st.setRanges()
	kept := st.progress[:0]
	for _, p := range st.progress {
		if p.id != id {
			kept = append(kept, p)
		}
	}
	st.progress = kept
}

func (st *watchStream) cancelWatch(id int64) error {
	if st.watches[id] == nil {
		return nil // etcd answers nothing for a watch it does not know
	}
	st.remove(id)
	rev, _, err := st.revisions()
	if err != nil {
		return err
	}
	return st.send(&pb.WatchResponse{Header: header(st.b, rev), WatchId: id, Canceled: true}, false)
}

// idle stops following the hub once the stream has no watch left, so
// that an idle stream costs the hub nothing.
func (st *watchStream) idle() error {
	if len(st.watches) > 0 || st.hub == nil {
		return nil
	}
	if err := st.interrupt(); err != nil {
		return err
	}
	if st.hub != nil {
		st.hub.Close()
		st.hub = nil
	}
	st.batchRev, st.target, st.progress = 0, 0, nil
	st.marker.Store(0)
	return nil
}

// took handles the result of a Next.
func (st *watchStream) took(res nextResult) error {
	switch err := res.err; {
	case err == nil:
	case errors.Is(err, watch.ErrLagged):
		return st.resync()
	case errors.Is(err, context.Canceled) && st.ctx.Err() == nil:
		// interrupted: scanned says how far it got
	default:
		return err
	}
	if e := &res.ev; res.err == nil && e.Type.IsKey() && e.KV != nil {
		if err := st.deliver(e); err != nil {
			return err
		}
	}
	return st.settle()
}

// deliver adds a live key event to the batch of each watch it is for.
func (st *watchStream) deliver(e *statemachine.Event) error {
	rev := e.KV.ModRevision
	if st.batchRev != 0 && rev != st.batchRev {
		if err := st.flush(); err != nil {
			return err
		}
	}
	for _, w := range st.watches {
		if rev < w.next || !w.keys.contains(e.KV.Key) {
			continue
		}
		if ev := w.event(e, 0); ev != nil {
			w.pending = append(w.pending, ev)
			st.batchRev = rev
		}
	}
	return nil
}

// settle sends what the stream now knows to be complete: the batch and
// the progress owed once it has looked at every event up to target; and
// sets a new target if something waits for one.
func (st *watchStream) settle() error {
	if st.target != 0 && st.scanned.Load() >= st.target {
		if err := st.reached(); err != nil {
			return err
		}
	}
	if st.target != 0 || st.batchRev == 0 && len(st.progress) == 0 {
		return nil
	}
	_, g, err := st.revisions()
	if err != nil {
		return err
	}
	if st.scanned.Load() >= g {
		return st.reached()
	}
	st.target = g
	st.marker.Store(g)
	return nil
}

// reached is called when the hub watcher has looked at every event up
// to the target: every command up to it has been seen whole.
func (st *watchStream) reached() error {
	st.target = 0
	st.marker.Store(0)
	if err := st.flush(); err != nil {
		return err
	}
	owed := st.progress
	st.progress = nil
	for _, p := range owed {
		if err := st.send(&pb.WatchResponse{Header: header(st.b, p.rev), WatchId: p.id}, false); err != nil {
			return err
		}
	}
	return nil
}

// flush sends the live batch, one response a watch, at the batch's
// revision (etcd's header for events as they happen).
func (st *watchStream) flush() error {
	rev := st.batchRev
	if rev == 0 {
		return nil
	}
	st.batchRev = 0
	for _, w := range st.watches {
		if len(w.pending) == 0 {
			continue
		}
		evs := w.pending
		w.pending, w.quiet, w.next = nil, false, rev+1
		if _, err := st.sendEvents(w, rev, evs); err != nil {
			return err
		}
	}
	return nil
}

// resync is the answer to the hub watcher lagging: events it had not
// read are gone from the hub, so every watch reads what it is owed from
// the history instead, and the stream follows the hub again from there.
// A watch whose history is compacted too is cancelled with the compact
// revision.
func (st *watchStream) resync() error {
	if st.hub != nil {
		st.hub.Close()
		st.hub = nil
	}
	// A batch not sent is read again from the history; the revision the
	// hub watcher was in the middle of may have more for any watch.
	owed := st.batchRev
	if owed == 0 {
		owed = st.scannedKV.Load()
	}
	st.batchRev = 0
	ws := make([]*watcher, 0, len(st.watches))
	for _, w := range st.watches {
		w.pending = nil
		w.next = max(w.next, owed)
		ws = append(ws, w)
	}
	if len(ws) == 0 {
		return nil
	}
	r, err := st.replayAndFollow(ws, nil)
	if err != nil {
		return err
	}
	if err := st.catchUp(ws, r); err != nil {
		return err
	}
	// Every event up to r.global is handled.
	return st.reached()
}

// requestProgress owes watch id (-1: all of the stream's) a response with
// no events at the current revision, sent once every event up to that
// revision is. As etcd 3.5, it answers nothing while a watch waits for a
// start revision still to come, or when the stream has no watch.
func (st *watchStream) requestProgress(id int64) error {
	if len(st.watches) == 0 {
		return nil
	}
	if err := st.interrupt(); err != nil {
		return err
	}
	rev, g, err := st.revisions()
	if err != nil {
		return err
	}
	for _, w := range st.watches {
		if (id == -1 || w.id == id) && w.start > rev {
			return nil
		}
	}
	st.progress = append(st.progress, progressWant{id: id, rev: rev})
	if st.hub == nil || st.scanned.Load() >= g {
		return st.reached()
	}
	if g > st.target {
		st.target = g
		st.marker.Store(g)
	}
	return nil
}

// tick sends the current revision to each watch with progress_notify
// that got no events since the last tick.
func (st *watchStream) tick() error {
	for _, w := range st.watches {
		if !w.progressNotify {
			continue
		}
		if w.quiet {
			if err := st.requestProgress(w.id); err != nil {
				return err
			}
		}
		w.quiet = true
	}
	return nil
}

// send sends wr, split as etcd's sendFragments does when the watch asked
// for fragments and wr is too big.
func (st *watchStream) send(wr *pb.WatchResponse, fragment bool) error {
	limit := st.srv.maxResponseBytes
	if !fragment || wr.Size() < limit || len(wr.Events) < 2 {
		return st.sendOne(wr)
	}
	evs := wr.Events
	for len(evs) > 0 {
		cur := *wr
		cur.Fragment = true
		cur.Events = nil
		n := 0
		for _, ev := range evs {
			cur.Events = append(cur.Events, ev)
			if len(cur.Events) > 1 && cur.Size() >= limit {
				cur.Events = cur.Events[:len(cur.Events)-1]
				break
			}
			n++
		}
		evs = evs[n:]
		cur.Fragment = len(evs) > 0
		if err := st.sendOne(&cur); err != nil {
			return err
		}
	}
	return nil
}

func (st *watchStream) sendOne(wr *pb.WatchResponse) error {
	if err := st.gs.Send(wr); err != nil {
		return fmt.Errorf("watch: send: %w", err)
	}
	return nil
}

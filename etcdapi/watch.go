package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/keyfeed"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// A Watch stream is etcd's protocol over key watches that exist once,
// in package keyfeed: each watch of a stream is a keyfeed.Feed, which
// joins the keys' history and the node's live events, resyncs from the
// history when the hub drops it, and refuses a compacted start; what is
// left here is etcd's: watch IDs, a Txn's events in one response,
// catch-up responses at the current revision, prev_kv and the
// NOPUT/NODELETE filters, fragments, progress, cancel reasons and the
// check that the caller still reads what it is sent.
//
// One goroutine (the handler's) owns the stream: it reads requests,
// turns batches into responses and sends them. Each watch's feed runs on
// a goroutine of its own (pump) that hands its batches to the owner one
// at a time, so that the owner sends a watch's responses in its order
// and knows how far each watch has been sent (watcher.level), which a
// progress response waits for.

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
		fed:     make(chan fed),
	}
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
		var err error
		select {
		case req := <-recvc:
			err = st.handle(req)
		case err = <-recvErr:
			if err == io.EOF {
				err = nil
			}
		case f := <-st.fed:
			err = st.took(f)
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

// watcher is one watch of a stream. Only the stream's goroutine uses it,
// but for feed, which its pump reads (and Mark, which is safe anywhere).
type watcher struct {
	id int64
	// release gives back the watch's slot of the caller's and the node's
	// open watches (Backend.HoldWatch).
	release        func()
	keys           keyRange
	start          int64 // the start_revision asked for
	prevKV         bool
	fragment       bool
	progressNotify bool
	noPut          bool
	noDelete       bool
	// quiet is set by each progress tick and cleared by events: a watch
	// still quiet at the next tick is sent the revision (etcd's
	// serverWatchStream.progress).
	quiet bool

	feed *keyfeed.Feed
	stop context.CancelFunc // ends the pump
	ctx  context.Context    // the pump's, ended by stop
	// pump is the state of the goroutine that reads feed (pumpParked,
	// pumpRunning, pumpWoken, pumpStopped); see pump.
	pump atomic.Int32
	// level is the global revision up to which every event the watch is
	// owed has been sent (keyfeed.Batch.Level).
	level int64
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

// fed is what a pump hands the owner: a watch's next batch, or why its
// feed ended.
type fed struct {
	w   *watcher
	b   keyfeed.Batch
	err error
}

type watchStream struct {
	srv *watchServer
	b   Backend
	gs  pb.Watch_WatchServer
	ctx context.Context

	watches map[int64]*watcher
	nextID  int64 // the next ID to try for a watch the server names

	fed      chan fed
	progress []progressWant

	// pumpMu orders starting a pump (wake, on the hub's goroutine)
	// before the stream's end waits for them: once closing is set, no
	// pump starts, so wg.Add never races wg.Wait.
	pumpMu  sync.Mutex
	closing bool
	wg      sync.WaitGroup // the pumps
}

// The states of a watch's pump. A watch has a goroutine only while its
// feed has something to hand over: an idle watch is parked, with no
// goroutine, and its feed calls wake when an event of its keys (or a
// Level it was asked for, or a reset) comes. A goroutine blocked for
// every watch cost about 4 KiB of stack each, more than the rest of the
// watch; etcd, too, serves a stream's watches without one each.
const (
	pumpParked  int32 = iota // no goroutine; wake starts one
	pumpRunning              // a goroutine reads the feed
	pumpWoken                // running, and woken since it last looked: it looks again before parking
	pumpStopped              // stopped: the feed is closed, or its goroutine will close it
)

// wake asks w's pump to read its feed again: it starts a goroutine for a
// parked watch. It is the feed's OnWake, so it may run with the hub's
// locks held: it only changes state and starts a goroutine.
func (st *watchStream) wake(w *watcher) {
	for {
		switch w.pump.Load() {
		case pumpParked:
			st.pumpMu.Lock()
			started := !st.closing && w.pump.CompareAndSwap(pumpParked, pumpRunning)
			if started {
				st.wg.Add(1)
			}
			st.pumpMu.Unlock()
			if started {
				go st.pump(w)
				return
			}
			if st.closing {
				return // close stops every watch; its feed is closed there
			}
		case pumpRunning:
			if w.pump.CompareAndSwap(pumpRunning, pumpWoken) {
				return
			}
		default: // woken already, or stopped
			return
		}
	}
}

// pump hands w's batches to the owner while its feed has any, then parks
// (wake starts it again), until w.ctx (w.stop) ends or the feed fails;
// whoever finds the pump stopped with no goroutine closes the feed
// (stopPump, or here).
func (st *watchStream) pump(w *watcher) {
	defer st.wg.Done()
	for {
		b, err := w.feed.TryNext(w.ctx)
		if errors.Is(err, keyfeed.ErrWouldWait) {
			if w.pump.CompareAndSwap(pumpRunning, pumpParked) {
				return
			}
			if w.pump.CompareAndSwap(pumpWoken, pumpRunning) {
				continue // woken while it looked: something may have come
			}
			w.feed.Close() // stopped while it ran
			return
		}
		select {
		case st.fed <- fed{w: w, b: b, err: err}:
		case <-w.ctx.Done():
			err = w.ctx.Err()
		}
		if err != nil {
			w.pump.Store(pumpStopped)
			w.feed.Close()
			return
		}
	}
}

// stopPump ends w's pump: its goroutine's, which closes the feed, or,
// parked, the feed here. Only the stream's goroutine calls it.
func (st *watchStream) stopPump(w *watcher) {
	w.stop()
	if w.pump.Swap(pumpStopped) == pumpParked {
		w.feed.Close()
	}
}

func (st *watchStream) close() {
	st.pumpMu.Lock()
	st.closing = true
	st.pumpMu.Unlock()
	for _, w := range st.watches {
		st.stopPump(w)
		w.release()
	}
	st.wg.Wait()
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

	// A feed from a revision is answered as of every write acknowledged
	// before it, wherever it was made (keyfeed.Open): above all a
	// compaction, after which etcd cancels a watch from before it (its
	// compacted response) on any member.
	//
	// A watch of one key, the common case (a lock's, a lease record's),
	// is a feed of that key: the hub indexes it by the key, so idle
	// watches of other keys cost a write nothing (keyfeed.OpenKey).
	if w.keys.end == "" && !w.keys.all {
		w.feed, err = keyfeed.OpenKey(st.ctx, st.b, cr.StartRevision, w.keys.key, nil)
	} else {
		w.feed, err = keyfeed.Open(st.ctx, st.b, cr.StartRevision, func(e *statemachine.Event) bool {
			return w.keys.contains(e.KV.Key)
		})
	}
	var compacted *watch.CompactedError
	if errors.As(err, &compacted) {
		w.release()
		return st.compacted(w.id, compacted)
	}
	if err != nil {
		w.release()
		return err
	}
	w.ctx, w.stop = context.WithCancel(st.ctx)
	w.pump.Store(pumpRunning) // this goroutine reads the feed until the pump starts
	w.feed.OnWake(func() { st.wake(w) })
	st.watches[w.id] = w
	if err := st.send(&pb.WatchResponse{Header: header(st.b, w.feed.Revision()), WatchId: w.id, Created: true}, false); err != nil {
		w.feed.Close()
		return err
	}
	// As etcd answers a watch that catches up: what it is owed before
	// anything else, each response at most keyfeed.MaxRevisions
	// revisions at the revision current when it was read.
	for w.feed.Replaying() {
		b, err := w.feed.Next(w.ctx)
		if err := st.took(fed{w: w, b: b, err: err}); err != nil || st.watches[w.id] != w {
			w.pump.Store(pumpStopped)
			w.feed.Close()
			return err
		}
	}
	st.pumpMu.Lock()
	st.wg.Add(1)
	st.pumpMu.Unlock()
	go st.pump(w)
	return nil
}

// compacted answers a watch whose history is compacted as etcd does:
// created, then cancelled with the compact revision (the header's
// revision is 0 there too). Its ID is free again.
func (st *watchStream) compacted(id int64, ce *watch.CompactedError) error {
	rev, _, err := st.revisions()
	if err != nil {
		return err
	}
	if err := st.send(&pb.WatchResponse{Header: header(st.b, rev), WatchId: id, Created: true}, false); err != nil {
		return err
	}
	return st.send(&pb.WatchResponse{Header: header(st.b, 0), WatchId: id, CompactRevision: ce.Oldest, Canceled: true}, false)
}

// took handles what a feed handed over: it sends the watch its events,
// or ends the watch, or the stream, with its feed.
func (st *watchStream) took(f fed) error {
	w := f.w
	if st.watches[w.id] != w {
		return nil // cancelled meanwhile
	}
	var compacted *watch.CompactedError
	switch {
	case errors.As(f.err, &compacted):
		st.remove(w.id)
		return st.send(&pb.WatchResponse{
			Header: header(st.b, 0), WatchId: w.id, CompactRevision: compacted.Oldest, Canceled: true,
		}, false)
	case f.err != nil:
		return f.err
	}
	var evs []*mvccpb.Event
	for i := range f.b.Events {
		if ev := w.event(&f.b.Events[i], f.b.Compact); ev != nil {
			evs = append(evs, ev)
		}
	}
	if len(evs) > 0 {
		if ended, err := st.sendEvents(w, f.b.Revision, evs); ended || err != nil {
			return err
		}
		w.quiet = false
	}
	w.level = max(w.level, f.b.Level)
	return st.settle()
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

// remove forgets watch id and its owed progress, and stops its pump.
func (st *watchStream) remove(id int64) {
	if w := st.watches[id]; w != nil {
		st.stopPump(w)
		w.release()
	}
	delete(st.watches, id)
	kept := st.progress[:0]
	for _, p := range st.progress {
		if p.id != id && len(st.watches) > 0 {
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

// progressWant is a progress response at KV revision rev, owed once the
// watches it is for (id, or clientv3.InvalidWatchID for all of them)
// have been sent every event up to global, the global revision rev was
// read with.
type progressWant struct {
	id          int64
	rev, global int64
}

// requestProgress owes watch id (-1: all of the stream's) a response with
// no events at the current revision, sent once every event up to that
// revision is. As etcd 3.5, it answers nothing while a watch waits for a
// start revision still to come, or when the stream has no watch.
func (st *watchStream) requestProgress(id int64) error {
	if len(st.watches) == 0 {
		return nil
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
	st.progress = append(st.progress, progressWant{id: id, rev: rev, global: g})
	return st.settle()
}

// settle sends the progress owed whose watches have been sent everything
// up to it, and asks the feeds of the others to say when they have
// (keyfeed.Feed.Mark).
func (st *watchStream) settle() error {
	kept := st.progress[:0]
	var err error
	for _, p := range st.progress {
		if err != nil || !st.level(p) {
			kept = append(kept, p)
			continue
		}
		err = st.send(&pb.WatchResponse{Header: header(st.b, p.rev), WatchId: p.id}, false)
	}
	st.progress = kept
	return err
}

// level reports whether the watches p is for have been sent every event
// up to p.global, and marks the feeds of those that have not.
func (st *watchStream) level(p progressWant) bool {
	ok := true
	for _, w := range st.watches {
		if (p.id == -1 || w.id == p.id) && w.level < p.global {
			w.feed.Mark(p.global)
			st.wake(w) // a Mark is no wake of the hub's (keyfeed.Feed.TryNext)
			ok = false
		}
	}
	return ok
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

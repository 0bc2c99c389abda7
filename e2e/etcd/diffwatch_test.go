//go:build linux

package etcd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// --- watch streams ---

// watchStream is one Watch stream, with one watch on it or several, and
// what it has received.
type watchStream struct {
	stream  pb.Watch_WatchClient
	cancel  context.CancelFunc
	done    chan struct{} // closed when recv returns
	watches int           // open on it; the caller closes it at 0

	mu      sync.Mutex // guards resps, err and changed
	resps   []*pb.WatchResponse
	err     error         // how the stream ended
	changed chan struct{} // closed and replaced when resps or err change
}

// openStream opens a Watch stream. The caller closes it.
func openStream(c pb.WatchClient) (*watchStream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.Watch(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	ws := &watchStream{stream: st, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	go ws.recv()
	return ws, nil
}

// recv keeps what the stream receives until it ends.
func (ws *watchStream) recv() {
	defer close(ws.done)
	for {
		resp, err := ws.stream.Recv()
		ws.mu.Lock()
		if err != nil {
			ws.err = err
		} else {
			ws.resps = append(ws.resps, resp)
		}
		close(ws.changed)
		ws.changed = make(chan struct{})
		ws.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// waitFor waits until cond holds of what the stream has received, or d
// passes, and tells which.
func (ws *watchStream) waitFor(d time.Duration, cond func(resps []*pb.WatchResponse, err error) bool) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		ws.mu.Lock()
		ok, ch := cond(ws.resps, ws.err), ws.changed
		ws.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// create asks for a watch on the stream and waits for its created
// response: the first one after what the stream had received. Creates
// are sent one at a time, so no other can answer in between.
func (ws *watchStream) create(req *pb.WatchCreateRequest) (*watchHandle, error) {
	ws.mu.Lock()
	n := len(ws.resps)
	ws.mu.Unlock()
	err := ws.stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: req}})
	if err != nil {
		return nil, err
	}
	var h *watchHandle
	ws.waitFor(eventTimeout, func(resps []*pb.WatchResponse, err error) bool {
		for i := n; i < len(resps); i++ {
			if resps[i].Created {
				h = &watchHandle{ws: ws, first: i, id: resps[i].WatchId}
				return true
			}
		}
		return err != nil
	})
	if h == nil {
		return nil, fmt.Errorf("no created response within %v", eventTimeout)
	}
	ws.watches++
	return h, nil
}

// close ends the stream and waits for its receiver.
func (ws *watchStream) close() {
	ws.cancel()
	<-ws.done
}

// watchHandle is one watch on a stream: what the stream received for its
// ID from its created response on.
type watchHandle struct {
	ws    *watchStream
	first int // the index of its created response among the stream's
	id    int64
}

func (h *watchHandle) mine(resps []*pb.WatchResponse) []*pb.WatchResponse {
	var out []*pb.WatchResponse
	for _, r := range resps[h.first:] {
		if r.WatchId == h.id {
			out = append(out, r)
		}
	}
	return out
}

// responses is what the watch has received, and how the stream ended.
func (h *watchHandle) responses() ([]*pb.WatchResponse, error) {
	h.ws.mu.Lock()
	defer h.ws.mu.Unlock()
	return h.mine(h.ws.resps), h.ws.err
}

// waitFor waits until cond holds of what the watch has received, or d
// passes.
func (h *watchHandle) waitFor(d time.Duration, cond func(resps []*pb.WatchResponse, err error) bool) bool {
	return h.ws.waitFor(d, func(resps []*pb.WatchResponse, err error) bool { return cond(h.mine(resps), err) })
}

// cancel sends a cancel for the watch, unless it has been cancelled
// already, and waits for the canceled response.
func (h *watchHandle) cancel() {
	if resps, _ := h.responses(); canceled(resps) {
		return
	}
	err := h.ws.stream.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
		CancelRequest: &pb.WatchCancelRequest{WatchId: h.id}}})
	if err != nil {
		return
	}
	h.waitFor(eventTimeout, func(resps []*pb.WatchResponse, err error) bool { return canceled(resps) || err != nil })
}

// done is the end of the watch on its stream, which it closes when it
// was the last.
func (h *watchHandle) done() {
	if h.ws.watches--; h.ws.watches == 0 {
		h.ws.close()
	}
}

func canceled(resps []*pb.WatchResponse) bool {
	return slices.ContainsFunc(resps, func(r *pb.WatchResponse) bool { return r.Canceled })
}

func lastEvent(resps []*pb.WatchResponse) int64 {
	var last int64
	for _, r := range resps {
		for _, ev := range r.Events {
			last = max(last, ev.Kv.ModRevision)
		}
	}
	return last
}

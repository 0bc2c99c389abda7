package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// The pipeline: a session's operations — acquire, release, set value,
// validate, key get/put/delete/compare-and-swap/validate, refresh, and
// the watch that tells a holder its grant ended — go to the leader as
// messages on one upgraded connection per endpoint, each tagged with an
// ID and answered out of order (package framing has the why and the format).
// Everything else (opening and closing sessions, lists, stale reads,
// watches, admin calls) stays unary, as do all calls to a server that
// has no pipeline.
//
// Retries stay exact. The writer counts the bytes the kernel took, and
// the server's GoAway names the last request it read, so a request that
// provably never reached the server fails as not sent (safe to repeat
// anywhere, even a compare-and-swap), and one that may have arrived
// fails as a lost connection: repeated if idempotent, ErrUnknownOutcome
// if not — the rules a unary call follows.

// pipedLeases sends Acquire, Release, SetValue and Validate on the
// pipeline, the rest as unary calls.
type pipedLeases struct {
	tenurev1connect.LeaseServiceClient
	ep *endpoint
}

func (l pipedLeases) Acquire(ctx context.Context, req *connect.Request[tenurev1.AcquireRequest]) (*connect.Response[tenurev1.AcquireResponse], error) {
	return piped(ctx, l.ep, l.LeaseServiceClient.Acquire, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Acquire{Acquire: req.Msg}},
		(*tenurev1.PipelineResponse).GetAcquire)
}

func (l pipedLeases) Release(ctx context.Context, req *connect.Request[tenurev1.ReleaseRequest]) (*connect.Response[tenurev1.ReleaseResponse], error) {
	return piped(ctx, l.ep, l.LeaseServiceClient.Release, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Release{Release: req.Msg}},
		(*tenurev1.PipelineResponse).GetRelease)
}

func (l pipedLeases) SetValue(ctx context.Context, req *connect.Request[tenurev1.SetValueRequest]) (*connect.Response[tenurev1.SetValueResponse], error) {
	return piped(ctx, l.ep, l.LeaseServiceClient.SetValue, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_SetValue{SetValue: req.Msg}},
		(*tenurev1.PipelineResponse).GetSetValue)
}

func (l pipedLeases) Validate(ctx context.Context, req *connect.Request[tenurev1.ValidateRequest]) (*connect.Response[tenurev1.ValidateResponse], error) {
	return piped(ctx, l.ep, l.LeaseServiceClient.Validate, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Validate{Validate: req.Msg}},
		(*tenurev1.PipelineResponse).GetValidate)
}

// pipedKV sends linearizable Gets, ValidateKey and all single-key writes
// on the pipeline. A stale Get is for the node called, which need not lead.
type pipedKV struct {
	tenurev1connect.KVServiceClient
	ep *endpoint
}

func (k pipedKV) Get(ctx context.Context, req *connect.Request[tenurev1.GetRequest]) (*connect.Response[tenurev1.GetResponse], error) {
	if req.Msg.GetStale() {
		return k.KVServiceClient.Get(ctx, req)
	}
	return piped(ctx, k.ep, k.KVServiceClient.Get, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Get{Get: req.Msg}},
		(*tenurev1.PipelineResponse).GetGet)
}

func (k pipedKV) Put(ctx context.Context, req *connect.Request[tenurev1.PutRequest]) (*connect.Response[tenurev1.PutResponse], error) {
	return piped(ctx, k.ep, k.KVServiceClient.Put, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Put{Put: req.Msg}},
		(*tenurev1.PipelineResponse).GetPut)
}

func (k pipedKV) Delete(ctx context.Context, req *connect.Request[tenurev1.DeleteRequest]) (*connect.Response[tenurev1.DeleteResponse], error) {
	return piped(ctx, k.ep, k.KVServiceClient.Delete, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Delete{Delete: req.Msg}},
		(*tenurev1.PipelineResponse).GetDelete)
}

func (k pipedKV) CompareAndSwap(ctx context.Context, req *connect.Request[tenurev1.CompareAndSwapRequest]) (*connect.Response[tenurev1.CompareAndSwapResponse], error) {
	return piped(ctx, k.ep, k.KVServiceClient.CompareAndSwap, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_CompareAndSwap{CompareAndSwap: req.Msg}},
		(*tenurev1.PipelineResponse).GetCompareAndSwap)
}

func (k pipedKV) ValidateKey(ctx context.Context, req *connect.Request[tenurev1.ValidateKeyRequest]) (*connect.Response[tenurev1.ValidateKeyResponse], error) {
	return piped(ctx, k.ep, k.KVServiceClient.ValidateKey, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_ValidateKey{ValidateKey: req.Msg}},
		(*tenurev1.PipelineResponse).GetValidateKey)
}

// pipedSessions sends Refresh on the pipeline.
type pipedSessions struct {
	tenurev1connect.SessionServiceClient
	ep *endpoint
}

func (s pipedSessions) Refresh(ctx context.Context, req *connect.Request[tenurev1.KeepAliveRequest]) (*connect.Response[tenurev1.KeepAliveResponse], error) {
	return piped(ctx, s.ep, s.SessionServiceClient.Refresh, req,
		&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Refresh{Refresh: req.Msg}},
		(*tenurev1.PipelineResponse).GetRefresh)
}

// piped sends req on ep's pipeline, or as the unary call when ep has
// none to offer: a server without pipelines, or a follower (which
// forwards the unary call to the leader, and names it, so that the
// next call goes to the leader's pipeline).
func piped[Req, Res any](ctx context.Context, ep *endpoint,
	unary func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
	req *connect.Request[Req], preq *tenurev1.PipelineRequest, get func(*tenurev1.PipelineResponse) *Res,
) (*connect.Response[Res], error) {
	p, err := ep.pipeline(ctx)
	if errors.Is(err, errUseUnary) {
		return unary(ctx, req)
	}
	if err != nil {
		return nil, err
	}
	resp, err := p.call(ctx, preq)
	if err != nil {
		return nil, err
	}
	msg := get(resp)
	if msg == nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("pipeline answer %d has an unexpected type %T", resp.GetId(), resp.GetResult()))
	}
	return connect.NewResponse(msg), nil
}

// watchGrant waits on ep's pipeline for the grant to end, returning the
// event that ended it. errUseUnary means the caller should watch with
// a unary stream instead.
func (ep *endpoint) watchGrant(ctx context.Context, req *tenurev1.WatchGrantRequest) (*tenurev1.LeaseEvent, error) {
	p, err := ep.pipeline(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := p.call(ctx, &tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_WatchGrant{WatchGrant: req}})
	if err != nil {
		return nil, err
	}
	return resp.GetWatchGrant().GetEvent(), nil
}

// errUseUnary says an endpoint offers no pipeline for this call.
var errUseUnary = errors.New("no pipeline here")

// errNotSent marks a request that provably never reached the server
// whole: notSent treats it as safe to repeat.
var errNotSent = errors.New("request not sent")

// pipeline returns ep's pipeline, connecting one if there is none or the
// last one broke.
func (ep *endpoint) pipeline(ctx context.Context) (*pipe, error) {
	if err := ep.lockPipe(ctx); err != nil {
		// Nothing left this machine: safe to send anywhere else.
		return nil, notSentError(fmt.Errorf("waiting for the pipeline to %s: %w", ep.url, err))
	}
	defer ep.unlockPipe()
	if ep.noPipe {
		return nil, errUseUnary
	}
	if ep.pipe != nil && ep.pipe.usable() {
		return ep.pipe, nil
	}
	p, err := ep.c.dialPipe(ctx, ep)
	if err != nil {
		return nil, err
	}
	ep.pipe = p
	return p, nil
}

// dialPipe upgrades a new connection to ep.
func (c *Client) dialPipe(ctx context.Context, ep *endpoint) (*pipe, error) {
	// The connection outlives this call: only the dial and the answer to
	// the upgrade are bounded, by the caller, by the dial timeout, and by
	// the silence the pipeline's pings allow: a live server answers the
	// upgrade at once, and a frozen one's kernel still accepts the
	// connection, so only the wait for the answer finds it.
	every, timeout := c.pingBounds()
	ctx, cancel := context.WithTimeout(ctx, min(c.opts.dialTimeout, every+timeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.url+framing.Path, nil)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", framing.Protocol)
	resp, err := c.http.Do(req)
	if err != nil {
		// As connect does for unary calls: the URL adds nothing to
		// "dial tcp ...: connection refused".
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		reason := api.Reason(resp.Header.Get(api.ErrorHeader))
		switch {
		case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed ||
			resp.StatusCode == http.StatusUpgradeRequired || resp.StatusCode < 400:
			// A server from before pipelines, or a proxy in between that
			// does not pass upgrades on: unary calls work through both.
			ep.noPipe = true
			return nil, errUseUnary
		case reason == api.ReasonNotLeader:
			// A follower: unary calls, which it forwards. The error says
			// whom it named as the leader ("" for nobody yet), which the
			// heartbeats go by during a failover.
			ce := connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: %s does not lead", errUseUnary, ep.url))
			ce.Meta().Set(api.ErrorHeader, string(reason))
			ce.Meta().Set(leaderHeader, resp.Header.Get(leaderHeader))
			return nil, ce
		}
		ce := connect.NewWireError(httpCode(resp.StatusCode), errors.New(strings.TrimSpace(string(body))))
		if reason != "" {
			ce.Meta().Set(api.ErrorHeader, string(reason))
		}
		return nil, ce
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, connect.NewError(connect.CodeInternal, errors.New("pipeline: the upgraded connection cannot be written"))
	}
	p := &pipe{
		c:     c,
		ep:    ep,
		conn:  rw,
		r:     framing.NewReader(bufio.NewReaderSize(rw, 32<<10), maxAnswerBytes),
		w:     framing.NewWriter(rw),
		calls: map[uint64]*pipeCall{},
		done:  make(chan struct{}),
	}
	p.heard.Store(time.Now().UnixNano())
	go p.readLoop()
	go p.watchdog()
	return p, nil
}

// maxAnswerBytes bounds one answer: a lease with the server's largest
// value and labels fits many times over.
const maxAnswerBytes = 16 << 20

// httpCode is the connect code of an HTTP status, as connect maps them.
func httpCode(status int) connect.Code {
	switch status {
	case http.StatusBadRequest:
		return connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated
	case http.StatusForbidden:
		return connect.CodePermissionDenied
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return connect.CodeUnavailable
	}
	return connect.CodeUnknown
}

// pipe is one pipelined connection.
type pipe struct {
	c    *Client
	ep   *endpoint
	conn io.ReadWriteCloser
	r    *framing.Reader
	w    *framing.Writer

	mu     sync.Mutex // guards the fields below; taken before w's lock
	nextID uint64
	calls  map[uint64]*pipeCall
	err    error // why the pipe is no longer usable, once it is not

	heard atomic.Int64  // when a frame last arrived, or the pipe last became busy (unix ns)
	done  chan struct{} // closed when the read loop has ended
}

type pipeCall struct {
	end int64 // stream offset where the request's frame ends
	ch  chan pipeResult
}

type pipeResult struct {
	resp *tenurev1.PipelineResponse
	err  error
}

func (p *pipe) usable() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err == nil
}

// call sends req and waits for its answer or ctx.
func (p *pipe) call(ctx context.Context, req *tenurev1.PipelineRequest) (*tenurev1.PipelineResponse, error) {
	call := &pipeCall{ch: make(chan pipeResult, 1)}
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return nil, notSentError(err)
	}
	// IDs rise in stream order (they are given under the lock that
	// orders appends), which is what lets GoAway's last ID divide the
	// requests the server read from those it did not.
	p.nextID++
	id := p.nextID
	req.Id = id
	end, err := p.w.Append(req)
	if err != nil {
		p.mu.Unlock()
		if errors.Is(err, framing.ErrEncode) {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
		return nil, notSentError(err)
	}
	call.end = end
	if len(p.calls) == 0 {
		// Silence counts only while an answer is awaited: an idle pipe's
		// last frame may be minutes old, which proves nothing.
		p.heard.Store(time.Now().UnixNano())
	}
	p.calls[id] = call
	p.mu.Unlock()
	if err := p.w.Flush(); err != nil {
		p.fail(err)
	}
	select {
	case r := <-call.ch:
		if r.err != nil {
			return nil, r.err
		}
		if e := r.resp.GetError(); e != nil {
			return nil, p.answerError(e)
		}
		return r.resp, nil
	case <-ctx.Done():
		p.mu.Lock()
		_, inFlight := p.calls[id]
		delete(p.calls, id)
		p.mu.Unlock()
		if inFlight {
			p.send(&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Cancel{Cancel: id}})
		}
		code := connect.CodeCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			code = connect.CodeDeadlineExceeded
		}
		return nil, connect.NewError(code, ctx.Err())
	}
}

// send writes a request that expects no answer (cancel, ping), best
// effort, and without making the caller wait for a write: the flush
// runs on its own goroutine, and usually finds the frame already gone
// with the caller's next request (an Unlock's release follows the
// cancel of the grant's watch).
func (p *pipe) send(req *tenurev1.PipelineRequest) {
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return
	}
	_, err := p.w.Append(req)
	p.mu.Unlock()
	if err != nil {
		if !errors.Is(err, framing.ErrEncode) {
			p.fail(err)
		}
		return
	}
	go func() {
		if err := p.w.Flush(); err != nil {
			p.fail(err)
		}
	}()
}

// answerError is the error a unary call would have returned for the
// server's answer e, and follows the leader it names.
func (p *pipe) answerError(e *tenurev1.PipelineError) error {
	ce := connect.NewWireError(connect.Code(e.GetCode()), errors.New(e.GetMessage()))
	if e.GetReason() != "" {
		ce.Meta().Set(api.ErrorHeader, e.GetReason())
	}
	for _, d := range e.GetDetails() {
		if detail, err := connect.NewErrorDetail(d); err == nil {
			ce.AddDetail(detail)
		}
	}
	if e.GetLeader() != "" {
		scheme, _, _ := strings.Cut(p.ep.url, "://")
		p.c.follow(scheme, e.GetLeader())
	}
	return ce
}

func (p *pipe) readLoop() {
	defer close(p.done)
	for {
		frame, err := p.r.Next()
		if err != nil {
			p.fail(err)
			return
		}
		resp := &tenurev1.PipelineResponse{}
		if err := proto.Unmarshal(frame, resp); err != nil {
			p.fail(fmt.Errorf("decode pipeline answer: %w", err))
			return
		}
		p.heard.Store(time.Now().UnixNano())
		if ga := resp.GetGoAway(); ga != nil {
			p.goAway(ga.GetLastId())
			continue
		}
		p.mu.Lock()
		call := p.calls[resp.GetId()]
		delete(p.calls, resp.GetId())
		p.mu.Unlock()
		if call != nil {
			call.ch <- pipeResult{resp: resp}
		}
	}
}

// pingEvery is how long a pipe with requests in flight may stay silent
// before it is asked for a pong, and pingTimeout how much longer before
// it is given up, while the client has no session with a shorter TTL
// (Client.pingBounds scales both down to an eighth of the shortest): the
// same bounds the heartbeat stream's HTTP/2 pings have. A parked Acquire
// is answered only when granted, so silence alone proves nothing.
const pingEvery, pingTimeout = 5 * time.Second, 5 * time.Second

// watchdog pings a silent pipe with calls in flight and breaks it when
// no pong comes: a node cut off by a partition, or frozen (SIGSTOP, a
// VM stall), never says goodbye. Breaking it takes the path of any
// broken connection (fail): every call in flight fails as retryable,
// and the read loop ends with the connection, so no answer can arrive
// after that. The bounds are read again at every tick: sessions come
// and go.
func (p *pipe) watchdog() {
	every, timeout := p.c.pingBounds()
	t := time.NewTimer(every / 2)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		every, timeout = p.c.pingBounds()
		t.Reset(every / 2)
		p.mu.Lock()
		busy := len(p.calls) > 0
		p.mu.Unlock()
		silent := time.Since(time.Unix(0, p.heard.Load()))
		switch {
		case silent > every+timeout && busy:
			p.fail(fmt.Errorf("pipeline: no answer to a ping for %v", silent.Round(time.Second)))
			return
		case silent > every && busy:
			p.send(&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Ping{Ping: &tenurev1.Ping{}}})
		}
	}
}

// goAway handles the server's last message: requests after lastID were
// never read, so they fail as not sent; the pipe takes no new ones.
func (p *pipe) goAway(lastID uint64) {
	p.mu.Lock()
	if p.err == nil {
		p.err = errors.New("the server is closing the pipeline")
	}
	var unread []*pipeCall
	for id, call := range p.calls {
		if id > lastID {
			unread = append(unread, call)
			delete(p.calls, id)
		}
	}
	p.mu.Unlock()
	for _, call := range unread {
		call.ch <- pipeResult{err: notSentError(errors.New("the server closed the pipeline before reading the request"))}
	}
}

// fail breaks the pipe: every call in flight fails, as not sent if its
// frame never left whole, else as a lost connection.
func (p *pipe) fail(cause error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = cause
	}
	calls := p.calls
	p.calls = nil
	p.mu.Unlock()
	p.w.Fail(cause)
	p.conn.Close()
	// A write still under way has handed the kernel bytes it has not
	// counted yet: wait for it (closing the connection ended it).
	written := p.w.Settled()
	for _, call := range calls {
		var err error = connect.NewError(connect.CodeUnavailable, fmt.Errorf("pipeline: %w", cause))
		if call.end > written {
			err = notSentError(cause)
		}
		call.ch <- pipeResult{err: err}
	}
}

// close breaks the pipe for Client.Close; the read loop then ends.
func (p *pipe) close() {
	p.fail(ErrClosed)
	<-p.done
}

func notSentError(cause error) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%w: %w", errNotSent, cause))
}

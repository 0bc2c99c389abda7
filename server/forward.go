package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

// Forwarding: any node serves clients. A unary call that only the leader
// can answer (a write, a linearizable read, a parked Acquire) is first
// run here, where it fails fast with "not leader" before anything is
// proposed; the forwarder then makes the same call on the leader and
// hands back the leader's answer, headers, errors and all, so that a
// caller cannot tell the difference but for one hop of latency. Streams
// are not forwarded: a KeepAlive or Snapshot stream on a follower ends
// with "not leader", and every response from a node that does not lead
// names the leader in LeaderHeader, which the Go client follows (a
// redirect). A heartbeat stream through a forwarding hop would double
// the cost of the commonest message and die with either node anyway.
const (
	// LeaderHeader is set on every response from a node that is not the
	// ready leader: the leader's API address, when one is known.
	LeaderHeader = "Tenure-Leader"
	// ForwardedHeader marks a call a follower forwarded; the node it
	// reaches answers it itself, so a stale view of who leads can never
	// bounce a call between two followers. Probes that must learn what
	// the node called would answer (is it the leader?) set it too.
	ForwardedHeader = "Tenure-Forwarded-By"
)

// forwardWait bounds how long a forwarded call waits for a leader to be
// known, or retries one that turned out not to lead, before answering
// "not leader" itself: a few election timeouts, so a call that arrives
// during a failover is answered by the new leader rather than refused.
const forwardWait = 3 * time.Second

// peers holds Connect clients for the other nodes' APIs, one set per
// address, over pooled HTTP/1.1 connections: on Go's HTTP/2 a unary call
// costs about twice the CPU (docs/benchmarks.md).
type peers struct {
	http   *http.Client
	scheme string // "http://" or "https://"

	mu      sync.Mutex
	clients map[string]*peerClients
}

type peerClients struct {
	sessions tenurev1connect.SessionServiceClient
	leases   tenurev1connect.LeaseServiceClient
	kv       tenurev1connect.KVServiceClient
	cluster  tenurev1connect.ClusterServiceClient
}

// newPeers calls other nodes' APIs in cleartext, or over TLS with
// tlsConfig (its certificate is presented to nodes that require client
// certificates; its RootCAs check theirs).
func newPeers(tlsConfig *tls.Config) *peers {
	var http1 http.Protocols
	http1.SetHTTP1(true)
	t := &http.Transport{
		Protocols:           &http1,
		TLSClientConfig:     tlsConfig,
		DialContext:         (&net.Dialer{Timeout: time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	scheme := "http://"
	if tlsConfig != nil {
		scheme = "https://"
	}
	return &peers{http: &http.Client{Transport: t}, scheme: scheme, clients: map[string]*peerClients{}}
}

// to returns the clients for the node serving at addr ("host:port").
func (p *peers) to(addr string) *peerClients {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[addr]; ok {
		return c
	}
	url := p.scheme + addr
	c := &peerClients{
		sessions: tenurev1connect.NewSessionServiceClient(p.http, url),
		leases:   tenurev1connect.NewLeaseServiceClient(p.http, url),
		kv:       tenurev1connect.NewKVServiceClient(p.http, url),
		cluster:  tenurev1connect.NewClusterServiceClient(p.http, url),
	}
	p.clients[addr] = c
	return c
}

func (p *peers) close() { p.http.CloseIdleConnections() }

// forwardFunc makes one call on a peer with the message of req, marked
// as forwarded by node by.
type forwardFunc func(ctx context.Context, to *peerClients, req connect.AnyRequest, by string) (connect.AnyResponse, error)

// forwarded builds the forwardFunc of one method from the generated
// client method that calls it.
func forwarded[C, Req, Res any](client func(*peerClients) C, call func(C, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) forwardFunc {
	return func(ctx context.Context, to *peerClients, req connect.AnyRequest, by string) (connect.AnyResponse, error) {
		msg, ok := req.Any().(*Req)
		if !ok {
			return nil, fmt.Errorf("forward %s: request is %T", req.Spec().Procedure, req.Any())
		}
		out := connect.NewRequest(msg)
		copyForwardHeaders(out.Header(), req.Header())
		out.Header().Set(ForwardedHeader, by)
		// The leader believes this only from a node's certificate.
		if c, ok := callerOf(ctx); ok && c.Principal != "" && c.Err == nil {
			out.Header().Set(auth.ForwardedPrincipalHeader, c.Principal)
		}
		res, err := call(client(to), ctx, out)
		if err != nil {
			return nil, err
		}
		// Only the message and Tenure's headers: the rest describe the
		// hop (its encoding, length, protocol), not the caller's call.
		back := connect.NewResponse(res.Msg)
		copyForwardHeaders(back.Header(), res.Header())
		return back, nil
	}
}

// copyForwardHeaders carries what the other end needs: credentials and
// Tenure's own headers.
func copyForwardHeaders(to, from http.Header) {
	for k, v := range from {
		if k == "Authorization" || strings.HasPrefix(k, "Tenure-") {
			to[k] = v
		}
	}
}

// answerOf turns the leader's error into the same error from this node:
// its code, message and Tenure headers, without the hop's own headers.
func answerOf(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	out := connect.NewError(ce.Code(), errors.New(ce.Message()))
	copyForwardHeaders(out.Meta(), ce.Meta())
	return out
}

func (c *peerClients) sessionsClient() tenurev1connect.SessionServiceClient { return c.sessions }
func (c *peerClients) leasesClient() tenurev1connect.LeaseServiceClient     { return c.leases }
func (c *peerClients) kvClient() tenurev1connect.KVServiceClient            { return c.kv }
func (c *peerClients) clusterClient() tenurev1connect.ClusterServiceClient  { return c.cluster }

// forwards lists every unary method a follower may have to forward. A
// test checks that it covers every unary method of the services but
// those answered by the node called (forwardExempt).
var forwards = map[string]forwardFunc{
	tenurev1connect.SessionServiceOpenProcedure:    forwarded((*peerClients).sessionsClient, tenurev1connect.SessionServiceClient.Open),
	tenurev1connect.SessionServiceRefreshProcedure: forwarded((*peerClients).sessionsClient, tenurev1connect.SessionServiceClient.Refresh),
	tenurev1connect.SessionServiceCloseProcedure:   forwarded((*peerClients).sessionsClient, tenurev1connect.SessionServiceClient.Close),
	tenurev1connect.SessionServiceGetProcedure:     forwarded((*peerClients).sessionsClient, tenurev1connect.SessionServiceClient.Get),
	tenurev1connect.SessionServiceListProcedure:    forwarded((*peerClients).sessionsClient, tenurev1connect.SessionServiceClient.List),

	tenurev1connect.LeaseServiceAcquireProcedure:            forwarded((*peerClients).leasesClient, tenurev1connect.LeaseServiceClient.Acquire),
	tenurev1connect.LeaseServiceReleaseProcedure:            forwarded((*peerClients).leasesClient, tenurev1connect.LeaseServiceClient.Release),
	tenurev1connect.LeaseServiceSetValueProcedure:           forwarded((*peerClients).leasesClient, tenurev1connect.LeaseServiceClient.SetValue),
	tenurev1connect.LeaseServiceRevokeProcedure:             forwarded((*peerClients).leasesClient, tenurev1connect.LeaseServiceClient.Revoke),
	tenurev1connect.LeaseServiceGetProcedure:                forwarded((*peerClients).leasesClient, tenurev1connect.LeaseServiceClient.Get),
	tenurev1connect.LeaseServiceListProcedure:               forwarded((*peerClients).leasesClient, tenurev1connect.LeaseServiceClient.List),
	tenurev1connect.LeaseServiceValidateProcedure:           forwarded((*peerClients).leasesClient, tenurev1connect.LeaseServiceClient.Validate),
	tenurev1connect.LeaseServiceSetPreferredHolderProcedure: forwarded((*peerClients).leasesClient, tenurev1connect.LeaseServiceClient.SetPreferredHolder),

	tenurev1connect.KVServiceGetProcedure:            forwarded((*peerClients).kvClient, tenurev1connect.KVServiceClient.Get),
	tenurev1connect.KVServiceRangeProcedure:          forwarded((*peerClients).kvClient, tenurev1connect.KVServiceClient.Range),
	tenurev1connect.KVServicePutProcedure:            forwarded((*peerClients).kvClient, tenurev1connect.KVServiceClient.Put),
	tenurev1connect.KVServiceDeleteProcedure:         forwarded((*peerClients).kvClient, tenurev1connect.KVServiceClient.Delete),
	tenurev1connect.KVServiceCompareAndSwapProcedure: forwarded((*peerClients).kvClient, tenurev1connect.KVServiceClient.CompareAndSwap),
	tenurev1connect.KVServiceValidateKeyProcedure:    forwarded((*peerClients).kvClient, tenurev1connect.KVServiceClient.ValidateKey),

	tenurev1connect.ClusterServiceJoinProcedure:               forwarded((*peerClients).clusterClient, tenurev1connect.ClusterServiceClient.Join),
	tenurev1connect.ClusterServiceRemoveMemberProcedure:       forwarded((*peerClients).clusterClient, tenurev1connect.ClusterServiceClient.RemoveMember),
	tenurev1connect.ClusterServiceTransferLeadershipProcedure: forwarded((*peerClients).clusterClient, tenurev1connect.ClusterServiceClient.TransferLeadership),
}

// forwardExempt are the unary methods every node answers itself.
var forwardExempt = map[string]bool{
	tenurev1connect.ClusterServiceMembersProcedure:   true,
	tenurev1connect.ClusterServiceStatusProcedure:    true,
	tenurev1connect.ClusterServiceIntroduceProcedure: true,
}

// forwarder is the interceptor that forwards refused calls to the leader.
type forwarder struct{ s *Server }

func (f forwarder) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		if err == nil || nativeapi.ReasonOf(err) != api.ReasonNotLeader || req.Header().Get(ForwardedHeader) != "" {
			return res, err
		}
		call, ok := forwards[req.Spec().Procedure]
		if !ok {
			return res, err
		}
		return f.s.forward(ctx, req, call, next, err)
	}
}

func (forwarder) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (forwarder) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// forward makes req's call on the leader. It waits for a leader while
// none is known and retries while the call provably did not reach one
// (refused connection, "not leader"), for up to forwardWait without a
// leader's answer; then it gives the caller refused, this node's own
// answer, which the client retries. If this node is elected meanwhile it
// answers the call itself with local, the handler that refused it at
// first. A call that reached the leader and failed in flight is answered
// with what is known: the leader's error, or Unavailable with the outcome
// in doubt (leadership-lost), never a guess that it did not happen. Only
// the search for a leader is bounded here: the call itself, a parked
// Acquire say, has the caller's context.
func (s *Server) forward(ctx context.Context, req connect.AnyRequest, call forwardFunc, local connect.UnaryFunc, refused error) (connect.AnyResponse, error) {
	deadline := time.Now().Add(forwardWait)
	pause := 10 * time.Millisecond
	for {
		wait, cancel := context.WithDeadline(ctx, deadline)
		addr, err := s.leaderAPI(wait)
		cancel()
		switch {
		case errors.Is(err, errThisNodeLeads):
			// Elected here meanwhile: the first try proposed nothing.
			return local(ctx, req)
		case err != nil && ctx.Err() == nil:
			return nil, refused // no leader in time
		case err != nil:
			return nil, toConnect(ctx.Err())
		}
		res, err := call(ctx, s.peers.to(addr), req, s.node.ID())
		switch {
		case err == nil:
			s.metrics.forwarded.Inc()
			// Name the leader even when this node learnt its address only
			// while the call waited, after the header was written.
			res.Header().Set(LeaderHeader, addr)
			return res, nil
		case nativeapi.ReasonOf(err).NotSent():
			// A leader answered that it no longer leads (a parked call
			// whose leader stepped down ends so): nothing was done, and
			// the next leader gets its own time to appear.
			deadline = time.Now().Add(forwardWait)
		case dialFailed(err):
			// The leader is not reachable: nothing was done.
		case connect.IsWireError(err):
			out := answerOf(err) // the leader's own answer
			var ce *connect.Error
			if errors.As(out, &ce) {
				ce.Meta().Set(LeaderHeader, addr)
			}
			return nil, out
		case ctx.Err() != nil:
			return nil, toConnect(ctx.Err())
		default:
			out := connect.NewError(connect.CodeUnavailable, fmt.Errorf("forwarding to the leader at %s failed after the call was sent; it may or may not have been applied: %w", addr, err))
			out.Meta().Set(api.ErrorHeader, string(api.ReasonLeadershipLost))
			return nil, out
		}
		if time.Now().After(deadline) {
			return nil, refused
		}
		select {
		case <-ctx.Done():
			return nil, toConnect(ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// errThisNodeLeads is leaderAPI's answer once this node is the promoted
// leader: there is nobody to forward to.
var errThisNodeLeads = errors.New("this node leads now")

func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// leaderAPI waits until another node is known to lead and has advertised
// its API address, and returns that address, or errThisNodeLeads once
// this node is the promoted leader. While it is elected but not yet
// promoted it waits too: the call is better answered here in a moment
// than refused.
func (s *Server) leaderAPI(ctx context.Context) (string, error) {
	for {
		if s.leading.Load() {
			return "", errThisNodeLeads
		}
		if addr, ok := s.leaderAddress(); ok && addr != s.advertise {
			return addr, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// leaderAddress is the leader's API address as this node knows it: its
// own when it leads, else what the leader advertised through the log.
func (s *Server) leaderAddress() (string, bool) {
	_, id := s.node.Leader()
	if id == "" {
		return "", false
	}
	if id == s.node.ID() {
		return s.advertise, true
	}
	var addr string
	var ok bool
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		addr, ok = m.MemberAddress(id)
		return nil
	})
	return addr, ok
}

// notLeaderError is the error for calls only the promoted leader
// serves, naming the leader that should be asked instead.
type notLeaderError struct {
	id, addr string // the leader's ID and API address, when known
}

func (e *notLeaderError) Error() string {
	switch {
	case e.id == "":
		return "not leader: no leader is known yet; retry shortly"
	case e.addr == "":
		return "not leader: the leader is " + e.id + ", which has not advertised its API address yet; retry shortly"
	}
	return "not leader: the leader is " + e.id + ", serving clients at " + e.addr
}

func (e *notLeaderError) Unwrap() error { return raftnode.ErrNotLeader }

// LeaderAddress is the leader's API address, "" when unknown: a
// pipelined answer names it in a field of its own.
func (e *notLeaderError) LeaderAddress() string { return e.addr }

// leaderHeader names the leader on every response from a node that is
// not the ready leader, so that clients can go to it directly, and while
// the node is closing asks clients not to reuse the connection.
func (s *Server) leaderHeader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.lastRequest.Store(time.Now().UnixNano())
		if s.closing.Load() {
			w.Header().Set("Connection", "close")
		}
		if !s.leading.Load() {
			if addr, ok := s.leaderAddress(); ok && addr != s.advertise {
				w.Header().Set(LeaderHeader, addr)
			}
		}
		next.ServeHTTP(w, r)
	})
}

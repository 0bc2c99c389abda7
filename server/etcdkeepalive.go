package server

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// An etcd client's LeaseKeepAlive stream lives as long as the client,
// across leader changes: clientv3 opens one and keeps it, and closes a
// lease's keep-alive channel when no answer comes within the lease's TTL
// of the last one. A stream bound to one leader for its whole life loses
// every lease it carries when that leader freezes: its connection stays
// open, the follower that forwarded it waits on it, and the client's
// deadline passes while a new leader, which would have answered, is never
// asked.
//
// So whichever node a client's stream reaches relays it to the node that
// leads now, and moves it when that changes: it serves the stream itself
// while it is the promoted leader, forwards it to the leader another node
// is, and waits while nobody is (or while it has been elected and not
// yet promoted, when it could only refuse). A forwarded stream is
// dropped as soon as this node sees another leader, or none, while a
// keep-alive on it waits for its answer, or when the node it reached
// answers that it does not lead; the keep-alives it left unanswered are
// asked again of the next leader, so that the client need not wait for
// its next round.
//
// This gives no node a say it would not have had: every answer still
// comes from a lessor of a promoted leader (the lessor's rules in
// lessor/doc.go), and the relay only chooses which leader is asked. A
// keep-alive answered by a deposed leader that had not yet learnt of it
// was possible before (the client's stream sat on it) and is no likelier
// now.

// etcdKeepAliveMethod is the stream the relay carries.
const etcdKeepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"

// Relay timing. relayLeaderPoll is how often a waiting relay (no leader
// known, or this node elected and not yet promoted) and a relay with a
// keep-alive unanswered look at who leads: about a raft heartbeat, so
// that a new leader is used within a small part of an election timeout.
// relayUpstreamQueue bounds the keep-alives queued for a forwarded
// stream that the leader does not take: past it they wait for the next
// leader (they are kept as unanswered), and the client sends again.
const (
	relayLeaderPoll    = 50 * time.Millisecond
	relayUpstreamQueue = 64
)

// keepAliveRelay carries one client's LeaseKeepAlive stream, down, to the
// node that leads; see the note at the top of this file. Its methods run
// on the stream's handler goroutine, except receive, which runs apart.
type keepAliveRelay struct {
	s       *Server
	down    grpc.ServerStream
	handler grpc.StreamHandler
	srv     any

	// reqs carries the client's keep-alives from receive; ended receives
	// how the client's side ended (io.EOF when it closed it), once.
	reqs  chan *pb.LeaseKeepAliveRequest
	ended chan error

	mu         sync.Mutex         // guards unanswered
	unanswered map[int64]struct{} // leases asked for and not answered since
}

// etcdRelayKeepAlive serves a client's LeaseKeepAlive stream through a
// keepAliveRelay until the client ends it, the node stops, or the leader
// refuses it for a reason that is not about leading (an authorization,
// say), which ends it with the leader's error.
func (s *Server) etcdRelayKeepAlive(srv any, ss grpc.ServerStream, handler grpc.StreamHandler) error {
	r := &keepAliveRelay{
		s: s, down: ss, handler: handler, srv: srv,
		reqs:       make(chan *pb.LeaseKeepAliveRequest),
		ended:      make(chan error, 1),
		unanswered: map[int64]struct{}{},
	}
	go r.receive()
	return r.run()
}

// receive reads the client's keep-alives until its side ends; it returns
// once the stream has ended, since the end of the handler ends a RecvMsg
// in progress.
func (r *keepAliveRelay) receive() {
	ctx := r.down.Context()
	for {
		req := new(pb.LeaseKeepAliveRequest)
		if err := r.down.RecvMsg(req); err != nil {
			r.ended <- err
			return
		}
		select {
		case r.reqs <- req:
		case <-ctx.Done():
			return
		}
	}
}

// run moves the stream from leader to leader until it ends.
func (r *keepAliveRelay) run() error {
	for {
		var (
			moved bool
			err   error
		)
		if r.s.leading.Load() {
			moved, err = r.serveHere()
		} else if conn, leader, ok := r.s.etcdLeaderConnOf(); ok {
			moved, err = r.forward(conn, leader)
		} else {
			moved, err = r.waitForLeader()
		}
		if !moved {
			return err
		}
	}
}

// serveHere serves the stream with this node's handler while this node
// leads. moved is true when the handler found that it no longer does:
// the keep-alive it was answering is left unanswered, for the next
// leader.
func (r *keepAliveRelay) serveHere() (moved bool, err error) {
	err = r.handler(r.srv, &relayedStream{ServerStream: r.down, r: r})
	if err == nil || !isNoLeader(err) || r.down.Context().Err() != nil {
		return false, err
	}
	return r.pause()
}

// waitForLeader holds the client's keep-alives while no other node is
// known to lead and this one is not promoted, until that changes.
func (r *keepAliveRelay) waitForLeader() (moved bool, err error) {
	return r.pause()
}

// pause waits relayLeaderPoll, taking the client's keep-alives as
// unanswered meanwhile. moved is false when the stream ends instead.
func (r *keepAliveRelay) pause() (moved bool, err error) {
	ctx := r.down.Context()
	wait := time.NewTimer(relayLeaderPoll)
	defer wait.Stop()
	for {
		select {
		case req := <-r.reqs:
			r.asked(req.ID)
		case err := <-r.ended:
			return false, clientEnd(err)
		case <-wait.C:
			return true, nil
		case <-ctx.Done():
			return false, ctx.Err()
		case <-r.s.stopC:
			return false, rpctypes.ErrGRPCStopped
		}
	}
}

// forward carries the stream to leader over conn until leader no longer
// leads as this node sees it (moved) or the stream ends.
func (r *keepAliveRelay) forward(conn *grpc.ClientConn, leader string) (moved bool, err error) {
	ctx, cancel := context.WithCancel(r.s.etcdForwardContext(r.down.Context()))
	var upstreams sync.WaitGroup
	defer upstreams.Wait()
	defer cancel()
	desc := &grpc.StreamDesc{StreamName: "LeaseKeepAlive", ServerStreams: true, ClientStreams: true}
	var trailer metadata.MD
	up, err := conn.NewStream(ctx, desc, etcdKeepAliveMethod, grpc.Trailer(&trailer))
	if err != nil {
		// The leader cannot be reached: it may have stopped, and the
		// next one will be known shortly.
		r.s.log.Debug("etcd keep-alive relay: cannot reach the leader", "leader", leader, "err", err)
		return r.pause()
	}

	// One goroutine sends to the leader and one receives from it, so that
	// a leader that stopped answering blocks neither the client's
	// keep-alives nor this loop's look at who leads.
	send := make(chan *pb.LeaseKeepAliveRequest, relayUpstreamQueue)
	answers := make(chan *pb.LeaseKeepAliveResponse)
	upEnded := make(chan error, 1)
	upstreams.Add(2)
	go func() {
		defer upstreams.Done()
		for {
			select {
			case req := <-send:
				if up.SendMsg(req) != nil {
					return // the receiving side learns how the stream ended
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		defer upstreams.Done()
		for {
			resp := new(pb.LeaseKeepAliveResponse)
			if err := up.RecvMsg(resp); err != nil {
				upEnded <- err
				return
			}
			select {
			case answers <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	enqueue := func(id int64) {
		select {
		case send <- &pb.LeaseKeepAliveRequest{ID: id}:
		default: // kept as unanswered, for the next leader
		}
	}
	for _, id := range r.pending() {
		enqueue(id)
	}

	for {
		// Who leads matters only while an answer is awaited: an idle
		// stream (most of a TTL) costs nothing.
		var look <-chan time.Time
		if r.awaiting() {
			look = time.After(relayLeaderPoll)
		}
		select {
		case req := <-r.reqs:
			r.asked(req.ID)
			if !r.s.etcdLeads(leader) {
				return true, nil
			}
			enqueue(req.ID)
		case resp := <-answers:
			r.answered(resp.ID)
			if err := r.down.SendMsg(resp); err != nil {
				return false, err
			}
		case err := <-upEnded:
			switch {
			case r.down.Context().Err() != nil:
				return false, r.down.Context().Err()
			case len(trailer.Get(etcdNoLeaderKey)) > 0, status.Code(err) == codes.Unavailable:
				// It no longer leads, or cannot be reached: the next
				// leader answers.
				r.s.log.Debug("etcd keep-alive relay: the leader ended the stream", "leader", leader, "err", err)
				return r.pause()
			case errors.Is(err, io.EOF):
				// Only this relay closes its side, and it never does.
				return false, status.Errorf(codes.Unavailable, "etcdserver: the leader %s ended a lease keep-alive stream it was not asked to end", leader)
			}
			return false, err // the leader's answer, as it gave it
		case <-look:
			if !r.s.etcdLeads(leader) {
				r.s.log.Debug("etcd keep-alive relay: the leader changed; moving the stream", "from", leader)
				return true, nil
			}
		case err := <-r.ended:
			return false, clientEnd(err)
		case <-r.down.Context().Done():
			return false, r.down.Context().Err()
		case <-r.s.stopC:
			return false, rpctypes.ErrGRPCStopped
		}
	}
}

// clientEnd is the stream's end when the client's side ended with err:
// none when the client closed it.
func clientEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func (r *keepAliveRelay) asked(id int64) {
	r.mu.Lock()
	r.unanswered[id] = struct{}{}
	r.mu.Unlock()
}

func (r *keepAliveRelay) answered(id int64) {
	r.mu.Lock()
	delete(r.unanswered, id)
	r.mu.Unlock()
}

func (r *keepAliveRelay) awaiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.unanswered) > 0
}

// pending is the leases asked for and not answered, to ask again.
func (r *keepAliveRelay) pending() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]int64, 0, len(r.unanswered))
	for id := range r.unanswered {
		ids = append(ids, id)
	}
	return ids
}

// relayedStream is the client's stream as this node's handler sees it
// while this node leads: it reads the keep-alives left unanswered by the
// previous leader first, then the client's, and notes what it answers.
// The handler reads and writes it from one goroutine at a time.
type relayedStream struct {
	grpc.ServerStream
	r      *keepAliveRelay
	replay []int64
	primed bool
}

func (rs *relayedStream) RecvMsg(m any) error {
	req, ok := m.(*pb.LeaseKeepAliveRequest)
	if !ok {
		return status.Errorf(codes.Internal, "etcd keep-alive relay: %T is not a keep-alive request", m)
	}
	if !rs.primed {
		rs.replay, rs.primed = rs.r.pending(), true
	}
	if len(rs.replay) > 0 {
		req.ID, rs.replay = rs.replay[0], rs.replay[1:]
		return nil
	}
	select {
	case in := <-rs.r.reqs:
		rs.r.asked(in.ID)
		*req = *in
		return nil
	case err := <-rs.r.ended:
		return err
	case <-rs.Context().Done():
		return rs.Context().Err()
	}
}

func (rs *relayedStream) SendMsg(m any) error {
	if resp, ok := m.(*pb.LeaseKeepAliveResponse); ok {
		rs.r.answered(resp.ID)
	}
	return rs.ServerStream.SendMsg(m)
}

// etcdLeads reports whether leader is, as this node sees it, the node
// that leads, and this node is not the promoted leader.
func (s *Server) etcdLeads(leader string) bool {
	if s.leading.Load() {
		return false
	}
	_, id := s.node.Leader()
	return id == leader
}

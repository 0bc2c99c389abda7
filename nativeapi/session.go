package nativeapi

import (
	"context"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/statemachine"
)

type sessionService struct{ a *API }

func (h *sessionService) Open(ctx context.Context, req *connect.Request[tenurev1.OpenSessionRequest]) (*connect.Response[tenurev1.OpenSessionResponse], error) {
	lim := h.a.limits
	ttl, err := lim.ttl("ttl", req.Msg.GetTtl(), lim.DefaultTTL)
	if err != nil {
		return nil, toConnect(err)
	}
	if id := req.Msg.GetIdentity(); id != "" {
		if err := lim.name("identity", id); err != nil {
			return nil, toConnect(err)
		}
	}
	if err := lim.labels("session", req.Msg.GetLabels()); err != nil {
		return nil, toConnect(err)
	}
	res, err := h.a.node.Propose(ctx, statemachine.OpenSession{
		Identity:       req.Msg.GetIdentity(),
		TTL:            int64(ttl),
		Labels:         req.Msg.GetLabels(),
		MaxPerIdentity: lim.MaxSessionsPerIdentity,
	})
	if err != nil {
		return nil, toConnect(err)
	}
	out := &tenurev1.Session{
		Id:       res.Session.ID,
		Identity: res.Session.Identity,
		Ttl:      durationpb.New(ttl),
		Labels:   res.Session.Labels,
		OpenTime: stamp(res.Session.OpenTime),
	}
	return connect.NewResponse(&tenurev1.OpenSessionResponse{Session: out}), nil
}

func (h *sessionService) heartbeat(ctx context.Context, procedure string, id int64) (*tenurev1.KeepAliveResponse, error) {
	if id <= 0 {
		return nil, Invalid("session_id must be a positive session ID, got %d", id)
	}
	// The one renewal of both APIs (frontend.Node.Renew): it checks and
	// audits the caller's ownership of the session, which only the
	// leader's state can tell, since heartbeats never enter the log.
	ttl, err := h.a.node.Renew(frontend.WithAction(ctx, procedure), id)
	switch {
	case errors.Is(err, statemachine.ErrSessionNotFound):
		return &tenurev1.KeepAliveResponse{SessionId: id, Expired: true}, nil
	case err != nil:
		return nil, err
	}
	return &tenurev1.KeepAliveResponse{SessionId: id, Ttl: durationpb.New(ttl)}, nil
}

// KeepAlive answers each heartbeat in order. An expired session is
// answered with expired=true and the stream stays open for the others it
// carries; losing leadership ends the stream with Unavailable so that the
// client moves to the new leader.
func (h *sessionService) KeepAlive(ctx context.Context, stream *connect.BidiStream[tenurev1.KeepAliveRequest, tenurev1.KeepAliveResponse]) error {
	for {
		req, err := stream.Receive()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := h.heartbeat(ctx, tenurev1connect.SessionServiceKeepAliveProcedure, req.GetSessionId())
		if err != nil {
			return toConnect(err)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (h *sessionService) Refresh(ctx context.Context, req *connect.Request[tenurev1.KeepAliveRequest]) (*connect.Response[tenurev1.KeepAliveResponse], error) {
	resp, err := h.heartbeat(ctx, tenurev1connect.SessionServiceRefreshProcedure, req.Msg.GetSessionId())
	if err != nil {
		return nil, toConnect(err)
	}
	if resp.Expired {
		return nil, toConnect(fmt.Errorf("%w: session %d expired or was closed", statemachine.ErrSessionNotFound, resp.SessionId))
	}
	return connect.NewResponse(resp), nil
}

func (h *sessionService) Close(ctx context.Context, req *connect.Request[tenurev1.CloseSessionRequest]) (*connect.Response[tenurev1.CloseSessionResponse], error) {
	if id := req.Msg.GetSessionId(); id <= 0 {
		return nil, toConnect(Invalid("session_id must be a positive session ID, got %d", id))
	}
	res, err := h.a.node.Propose(ctx, statemachine.CloseSession{SessionID: req.Msg.GetSessionId()})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tenurev1.CloseSessionResponse{Revision: res.Revision}), nil
}

func (h *sessionService) Get(ctx context.Context, req *connect.Request[tenurev1.GetSessionRequest]) (*connect.Response[tenurev1.GetSessionResponse], error) {
	if id := req.Msg.GetSessionId(); id <= 0 {
		return nil, toConnect(Invalid("session_id must be a positive session ID, got %d", id))
	}
	var out *tenurev1.Session
	err := h.a.node.Read(ctx, req.Msg.GetStale(), func(m *statemachine.Machine) error {
		sess, ok := m.Session(req.Msg.GetSessionId())
		if !ok {
			return SessionNotFound(req.Msg.GetSessionId())
		}
		out = sessionProto(m, sess, h.a.node)
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tenurev1.GetSessionResponse{Session: out}), nil
}

func (h *sessionService) List(ctx context.Context, req *connect.Request[tenurev1.ListSessionsRequest]) (*connect.Response[tenurev1.ListSessionsResponse], error) {
	sel, err := parseSelector(req.Msg.GetLabelSelector())
	if err != nil {
		return nil, toConnect(err)
	}
	out := &tenurev1.ListSessionsResponse{}
	err = h.a.node.Read(ctx, req.Msg.GetStale(), func(m *statemachine.Machine) error {
		for _, sess := range m.Sessions() {
			if sel.matches(sess.Labels) {
				out.Sessions = append(out.Sessions, sessionProto(m, sess, h.a.node))
			}
		}
		out.Revision = m.Revision()
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

// SessionNotFound is the one answer for a session that does not exist,
// and for one the caller may not see.
func SessionNotFound(id int64) error {
	return fmt.Errorf("%w: session %d", statemachine.ErrSessionNotFound, id)
}

package nativeapi

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/kubelease"
	"github.com/tenurehq/tenure/statemachine"
)

type leaseService struct{ a *API }

func (h *leaseService) acquireCommand(msg *tenurev1.AcquireRequest) (statemachine.Acquire, error) {
	lim := h.a.limits
	id, err := h.a.limits.leaseID(msg.GetNamespace(), msg.GetName())
	if err != nil {
		return statemachine.Acquire{}, err
	}
	if msg.GetSessionId() <= 0 {
		return statemachine.Acquire{}, Invalid("session_id must be a positive session ID, got %d", msg.GetSessionId())
	}
	capacity := int(msg.GetCapacity())
	if capacity == 0 {
		capacity = 1
	}
	if capacity < 1 || capacity > lim.MaxCapacity {
		return statemachine.Acquire{}, Invalid("capacity %d is outside 1..%d", msg.GetCapacity(), lim.MaxCapacity)
	}
	if err := lim.value("value", msg.GetValue()); err != nil {
		return statemachine.Acquire{}, err
	}
	if err := lim.labels("lease", msg.GetLabels()); err != nil {
		return statemachine.Acquire{}, err
	}
	delay := msg.GetLockDelay().AsDuration()
	if delay < 0 || delay > lim.MaxTTL {
		return statemachine.Acquire{}, Invalid("lock_delay %v is outside 0..%v", delay, lim.MaxTTL)
	}
	if t := msg.GetWaitTimeout().AsDuration(); t < 0 {
		return statemachine.Acquire{}, Invalid("wait_timeout %v is negative", t)
	}
	gc, err := lim.gcAfter(msg.GetGcAfter())
	if err != nil {
		return statemachine.Acquire{}, err
	}
	maxHold := msg.GetMaxHold().AsDuration()
	switch {
	case maxHold < 0:
		return statemachine.Acquire{}, Invalid("max_hold %v is negative", maxHold)
	case lim.MaxHold > 0 && maxHold > lim.MaxHold:
		return statemachine.Acquire{}, Invalid("max_hold %v is over the server's limit of %v (--max-hold-limit)", maxHold, lim.MaxHold)
	}
	return statemachine.Acquire{
		SessionID:  msg.GetSessionId(),
		Lease:      id,
		Capacity:   capacity,
		Wait:       msg.GetWait(),
		Value:      msg.GetValue(),
		Labels:     msg.GetLabels(),
		LockDelay:  int64(delay),
		MaxWaiters: lim.MaxWaitersPerLease,
		Exclusive:  msg.GetExclusive(),
		GCAfter:    int64(gc),
		MaxHold:    int64(maxHold),
	}, nil
}

// Acquire grants at once, or (with wait) parks until the state machine
// grants this session, the wait times out, or the session ends.
func (h *leaseService) Acquire(ctx context.Context, req *connect.Request[tenurev1.AcquireRequest]) (*connect.Response[tenurev1.AcquireResponse], error) {
	cmd, err := h.acquireCommand(req.Msg)
	if err != nil {
		return nil, toConnect(err)
	}
	token, lease, err := h.a.node.Acquire(ctx, cmd, req.Msg.GetWaitTimeout().AsDuration())
	if err != nil {
		return nil, toConnect(err)
	}
	if token == 0 {
		return h.notAcquired(ctx, cmd.Lease)
	}
	return connect.NewResponse(&tenurev1.AcquireResponse{Acquired: true, Token: token, Lease: h.leaseNow(ctx, cmd.Lease, lease)}), nil
}

func (h *leaseService) notAcquired(ctx context.Context, id statemachine.LeaseID) (*connect.Response[tenurev1.AcquireResponse], error) {
	resp := &tenurev1.AcquireResponse{}
	err := h.a.node.Read(ctx, true, func(m *statemachine.Machine) error {
		if l, ok := m.Lease(id); ok {
			resp.Lease = leaseProto(m, l, h.a.node)
		}
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(resp), nil
}

// leaseNow renders the lease as it is now, from the command's result when
// there is one.
func (h *leaseService) leaseNow(ctx context.Context, id statemachine.LeaseID, l *statemachine.Lease) *tenurev1.Lease {
	var out *tenurev1.Lease
	_ = h.a.node.Read(ctx, true, func(m *statemachine.Machine) error {
		if l == nil {
			cur, ok := m.Lease(id)
			if !ok {
				return nil
			}
			l = &cur
		}
		out = leaseProto(m, *l, h.a.node)
		return nil
	})
	return out
}

func (h *leaseService) Release(ctx context.Context, req *connect.Request[tenurev1.ReleaseRequest]) (*connect.Response[tenurev1.ReleaseResponse], error) {
	id, err := h.a.limits.leaseID(req.Msg.GetNamespace(), req.Msg.GetName())
	if err != nil {
		return nil, toConnect(err)
	}
	res, err := h.a.node.Propose(ctx, statemachine.Release{Lease: id, Token: req.Msg.GetToken()})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tenurev1.ReleaseResponse{Revision: res.Revision}), nil
}

func (h *leaseService) SetValue(ctx context.Context, req *connect.Request[tenurev1.SetValueRequest]) (*connect.Response[tenurev1.SetValueResponse], error) {
	id, err := h.a.limits.leaseID(req.Msg.GetNamespace(), req.Msg.GetName())
	if err != nil {
		return nil, toConnect(err)
	}
	if err := h.a.limits.value("value", req.Msg.GetValue()); err != nil {
		return nil, toConnect(err)
	}
	res, err := h.a.node.Propose(ctx, statemachine.SetValue{Lease: id, Token: req.Msg.GetToken(), Value: req.Msg.GetValue()})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tenurev1.SetValueResponse{Revision: res.Revision}), nil
}

func (h *leaseService) Revoke(ctx context.Context, req *connect.Request[tenurev1.RevokeRequest]) (*connect.Response[tenurev1.RevokeResponse], error) {
	id, err := h.a.limits.leaseID(req.Msg.GetNamespace(), req.Msg.GetName())
	if err != nil {
		return nil, toConnect(err)
	}
	if err := h.a.limits.value("reason", req.Msg.GetReason()); err != nil {
		return nil, toConnect(err)
	}
	res, err := h.a.node.Propose(ctx, statemachine.Revoke{Lease: id, Token: req.Msg.GetToken(), Reason: req.Msg.GetReason()})
	if err != nil {
		return nil, toConnect(err)
	}
	h.a.log.Info("lease revoked", "lease", id.String(), "tokens", res.Revoked, "reason", req.Msg.GetReason())
	return connect.NewResponse(&tenurev1.RevokeResponse{Revision: res.Revision, Revoked: res.Revoked}), nil
}

// SetPreferredHolder names (or clears) the identity a lease prefers. The
// state machine refuses it until every member runs cluster version 2.
func (h *leaseService) SetPreferredHolder(ctx context.Context, req *connect.Request[tenurev1.SetPreferredHolderRequest]) (*connect.Response[tenurev1.SetPreferredHolderResponse], error) {
	id, err := h.a.limits.leaseID(req.Msg.GetNamespace(), req.Msg.GetName())
	if err != nil {
		return nil, toConnect(err)
	}
	if who := req.Msg.GetIdentity(); who != "" {
		if err := h.a.limits.name("identity", who); err != nil {
			return nil, toConnect(err)
		}
	}
	res, err := h.a.node.Propose(ctx, statemachine.SetPreferred{Lease: id, Identity: req.Msg.GetIdentity()})
	if err != nil {
		return nil, toConnect(err)
	}
	h.a.log.Info("preferred holder set", "lease", id.String(), "identity", req.Msg.GetIdentity())
	return connect.NewResponse(&tenurev1.SetPreferredHolderResponse{Revision: res.Revision, Lease: h.leaseNow(ctx, id, res.Lease)}), nil
}

func (h *leaseService) Get(ctx context.Context, req *connect.Request[tenurev1.GetLeaseRequest]) (*connect.Response[tenurev1.GetLeaseResponse], error) {
	id, err := h.a.limits.leaseID(req.Msg.GetNamespace(), req.Msg.GetName())
	if err != nil {
		return nil, toConnect(err)
	}
	out := &tenurev1.GetLeaseResponse{}
	err = h.a.node.Read(ctx, req.Msg.GetStale(), func(m *statemachine.Machine) error {
		l, ok := m.Lease(id)
		if !ok {
			return fmt.Errorf("%w: %s", statemachine.ErrLeaseNotFound, id)
		}
		out.Lease, out.Revision = leaseProto(m, l, h.a.node), m.Revision()
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

func (h *leaseService) List(ctx context.Context, req *connect.Request[tenurev1.ListLeasesRequest]) (*connect.Response[tenurev1.ListLeasesResponse], error) {
	ns := ""
	if !req.Msg.GetAllNamespaces() {
		var err error
		if ns, err = h.a.limits.namespace(req.Msg.GetNamespace()); err != nil {
			return nil, toConnect(err)
		}
	}
	sel, err := parseSelector(req.Msg.GetLabelSelector())
	if err != nil {
		return nil, toConnect(err)
	}
	out := &tenurev1.ListLeasesResponse{}
	err = h.a.node.Read(ctx, req.Msg.GetStale(), func(m *statemachine.Machine) error {
		for _, l := range m.Leases(ns) {
			if sel.matches(l.Labels) {
				out.Leases = append(out.Leases, leaseProto(m, l, h.a.node))
			}
		}
		// etcd's recipe locks have no namespace: they are listed
		// across all namespaces only, after the leases, and have no
		// labels for a selector to match.
		if req.Msg.GetAllNamespaces() && sel.matches(nil) {
			for _, l := range m.RecipeLocks() {
				since, joined := h.a.node.RecipeTimes(l)
				out.Leases = append(out.Leases, recipeLeaseProto(m, l, since, joined, h.a.node))
			}
			// Kubernetes Leases likewise, though they have namespaces:
			// those are the cluster's, and a listing of one namespace
			// is one of Tenure's, whose leases a client may act on.
			if pfx := h.a.node.KubernetesPrefix(); pfx != "" {
				now := time.Now()
				for _, l := range m.KubernetesLeases(pfx) {
					out.Leases = append(out.Leases, kubernetesLeaseProto(l, now))
				}
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

// Validate is the downstream worker's check: is this token still a
// current holder's? Linearizable, so a deposed owner is never told yes
// after its successor was granted.
func (h *leaseService) Validate(ctx context.Context, req *connect.Request[tenurev1.ValidateRequest]) (*connect.Response[tenurev1.ValidateResponse], error) {
	id, err := h.a.limits.leaseID(req.Msg.GetNamespace(), req.Msg.GetName())
	if err != nil {
		return nil, toConnect(err)
	}
	if req.Msg.GetToken() <= 0 {
		return nil, toConnect(Invalid("token must be a positive fencing token, got %d", req.Msg.GetToken()))
	}
	out := &tenurev1.ValidateResponse{}
	err = h.a.node.Read(ctx, false, func(m *statemachine.Machine) error {
		out.Revision = m.Revision()
		l, ok := m.Lease(id)
		if !ok {
			return nil
		}
		for i, g := range l.Holders {
			if i == 0 {
				out.HolderIdentity, out.CurrentToken = g.Holder, g.Token
			}
			out.Tokens = append(out.Tokens, g.Token)
			if g.Token == req.Msg.GetToken() {
				out.Valid = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

func (h *leaseService) Watch(ctx context.Context, req *connect.Request[tenurev1.WatchLeasesRequest], stream *connect.ServerStream[tenurev1.LeaseEvent]) error {
	m := req.Msg
	spec, err := h.a.limits.leaseWatch(m.GetAllNamespaces(), m.GetNamespace(), m.GetName(), m.GetStartRevision(), m.GetEtcdLocks(), h.kubernetesKeys(m.GetKubernetesLeases()))
	if err != nil {
		return toConnect(err)
	}
	kubeKeys := h.kubernetesKeys(m.GetKubernetesLeases())
	return h.a.streamEvents(ctx, spec, func(e *statemachine.Event) error {
		return stream.Send(leaseEventProto(e, kubeKeys))
	})
}

// kubernetesKeys is the prefix of the Kubernetes Leases' keys a lease
// watch follows when it asks for them, or "" when it does not or the
// view is off.
func (h *leaseService) kubernetesKeys(asked bool) string { return h.a.kubernetesKeys(asked) }

func (a *API) kubernetesKeys(asked bool) string {
	if pfx := a.node.KubernetesPrefix(); asked && pfx != "" {
		return kubelease.KeysPrefix(pfx)
	}
	return ""
}

package nativeapi

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/statemachine"
)

type kvService struct{ a *API }

// The KV API answers in the keys' clock, the KV revision (statemachine
// mvcc.go), which keys' create and mod revisions and key watches use;
// before cluster version 5, keys took the global revision.
func keyClock(m *statemachine.Machine) int64 {
	if r := m.KVRevision(); r > 0 {
		return r
	}
	return m.Revision()
}

// keyRevision is keyClock after a command.
func keyRevision(res statemachine.Result) int64 {
	if res.KVRevision > 0 {
		return res.KVRevision
	}
	return res.Revision
}

func (h *kvService) Get(ctx context.Context, req *connect.Request[tenurev1.GetRequest]) (*connect.Response[tenurev1.GetResponse], error) {
	key := req.Msg.GetKey()
	if err := h.a.limits.readKey("key", key); err != nil {
		return nil, toConnect(err)
	}
	out := &tenurev1.GetResponse{}
	err := h.a.node.Read(ctx, req.Msg.GetStale(), func(m *statemachine.Machine) error {
		kv, ok := m.Key(key)
		if !ok {
			return fmt.Errorf("%w: %q", statemachine.ErrKeyNotFound, key)
		}
		out.Kv, out.Revision = kvProto(&kv), keyClock(m)
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

func (h *kvService) Range(ctx context.Context, req *connect.Request[tenurev1.RangeRequest]) (*connect.Response[tenurev1.RangeResponse], error) {
	if req.Msg.GetLimit() < 0 {
		return nil, toConnect(Invalid("limit %d is negative", req.Msg.GetLimit()))
	}
	out := &tenurev1.RangeResponse{}
	err := h.a.node.Read(ctx, req.Msg.GetStale(), func(m *statemachine.Machine) error {
		kvs, more := m.Range(req.Msg.GetPrefix(), int(req.Msg.GetLimit()))
		for i := range kvs {
			out.Kvs = append(out.Kvs, kvProto(&kvs[i]))
		}
		out.More, out.Revision, out.GlobalRevision = more, keyClock(m), m.Revision()
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

// keyWrite checks what Put and CompareAndSwap share: key, value, TTL.
func (h *kvService) keyWrite(key, value string, ttlMsg *durationpb.Duration) (int64, error) {
	lim := h.a.limits
	if err := lim.name("key", key); err != nil {
		return 0, err
	}
	if err := lim.value("value", value); err != nil {
		return 0, err
	}
	ttl, err := lim.ttl("ttl", ttlMsg, 0)
	if err != nil {
		return 0, err
	}
	return int64(ttl), nil
}

func (h *kvService) Put(ctx context.Context, req *connect.Request[tenurev1.PutRequest]) (*connect.Response[tenurev1.PutResponse], error) {
	ttl, err := h.keyWrite(req.Msg.GetKey(), req.Msg.GetValue(), req.Msg.GetTtl())
	if err != nil {
		return nil, toConnect(err)
	}
	if req.Msg.GetSessionId() < 0 {
		return nil, toConnect(Invalid("session_id %d is negative", req.Msg.GetSessionId()))
	}
	res, err := h.a.node.Propose(ctx, statemachine.Put{Key: req.Msg.GetKey(), Value: req.Msg.GetValue(), TTL: ttl, SessionID: req.Msg.GetSessionId()})
	if err != nil {
		return nil, toConnect(err)
	}
	out := &tenurev1.PutResponse{Revision: keyRevision(res)}
	if h.a.node.MayRead(ctx, req.Msg.GetKey()) {
		out.PrevKv = kvProto(res.PrevKV)
	}
	return connect.NewResponse(out), nil
}

func (h *kvService) Delete(ctx context.Context, req *connect.Request[tenurev1.DeleteRequest]) (*connect.Response[tenurev1.DeleteResponse], error) {
	key := req.Msg.GetKey()
	if !req.Msg.GetPrefix() {
		if err := h.a.limits.readKey("key", key); err != nil {
			return nil, toConnect(err)
		}
	} else if key == "" {
		return nil, toConnect(Invalid("an empty prefix would delete every key; name a prefix"))
	}
	res, err := h.a.node.Propose(ctx, statemachine.Delete{Key: key, Prefix: req.Msg.GetPrefix()})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(&tenurev1.DeleteResponse{Deleted: res.Deleted, Revision: keyRevision(res)}), nil
}

// CompareAndSwap fails with FailedPrecondition when the compare does not
// hold; the error carries the key as it is, so the caller can print
// "[expected != actual] revision" without a second read.
func (h *kvService) CompareAndSwap(ctx context.Context, req *connect.Request[tenurev1.CompareAndSwapRequest]) (*connect.Response[tenurev1.CompareAndSwapResponse], error) {
	msg := req.Msg
	ttl, err := h.keyWrite(msg.GetKey(), msg.GetValue(), msg.GetTtl())
	if err != nil {
		return nil, toConnect(err)
	}
	cmd := statemachine.CompareAndSwap{Key: msg.GetKey(), Delete: msg.GetDelete(), NewValue: msg.GetValue(), TTL: ttl, SessionID: msg.GetSessionId()}
	switch t := msg.GetCompare().GetTarget().(type) {
	case *tenurev1.Compare_Absent:
		if !t.Absent {
			return nil, toConnect(Invalid("compare.absent must be true when set"))
		}
		cmd.Target = statemachine.CompareAbsent
	case *tenurev1.Compare_Value:
		if err := h.a.limits.value("compare.value", t.Value); err != nil {
			return nil, toConnect(err)
		}
		cmd.Target, cmd.Value = statemachine.CompareValue, t.Value
	case *tenurev1.Compare_ModRevision:
		if t.ModRevision < 0 {
			return nil, toConnect(Invalid("compare.mod_revision %d is negative", t.ModRevision))
		}
		cmd.Target, cmd.ModRevision = statemachine.CompareModRevision, t.ModRevision
	default:
		return nil, toConnect(Invalid("compare must set one of absent, value or mod_revision"))
	}
	if msg.GetSessionId() < 0 {
		return nil, toConnect(Invalid("session_id %d is negative", msg.GetSessionId()))
	}
	res, err := h.a.node.Propose(ctx, cmd)
	if err != nil {
		if !errors.Is(err, statemachine.ErrCompareFailed) {
			return nil, toConnect(err)
		}
		// What the key holds is for those who may read it: a write-only
		// caller learns that the compare failed, and the revisions.
		kv, readable := kvProto(res.KV), h.a.node.MayRead(ctx, msg.GetKey())
		if !readable && kv != nil {
			kv.Value = ""
			if cmd.Target == statemachine.CompareValue {
				err = fmt.Errorf("%w: the value of key %q is not the one expected (the caller may not read it)", statemachine.ErrCompareFailed, msg.GetKey())
			}
		}
		ce := toConnect(err)
		var cerr *connect.Error
		if errors.As(ce, &cerr) {
			if detail, derr := connect.NewErrorDetail(&tenurev1.GetResponse{Kv: kv, Revision: keyRevision(res)}); derr == nil {
				cerr.AddDetail(detail)
			}
		}
		return nil, ce
	}
	return connect.NewResponse(&tenurev1.CompareAndSwapResponse{Revision: keyRevision(res), Kv: kvProto(res.KV)}), nil
}

func (h *kvService) Watch(ctx context.Context, req *connect.Request[tenurev1.WatchRequest], stream *connect.ServerStream[tenurev1.WatchEvent]) error {
	m := req.Msg
	spec, err := h.a.limits.keyWatch(m.GetKey(), m.GetPrefix(), m.GetStartRevision())
	if err != nil {
		return toConnect(err)
	}
	return h.a.streamEvents(ctx, spec, func(e *statemachine.Event) error {
		return stream.Send(keyEventProto(e))
	})
}

// ValidateKey is Validate for an etcd-style lock: the holder knows the
// key it made and a revision at which it held it. The key's incarnation
// at that revision is still the key exactly when the key exists now and
// was created at or before it: a delete ends an incarnation and a new
// create starts one at a later revision. Linearizable, like Validate.
func (h *kvService) ValidateKey(ctx context.Context, req *connect.Request[tenurev1.ValidateKeyRequest]) (*connect.Response[tenurev1.ValidateKeyResponse], error) {
	key, rev := req.Msg.GetKey(), req.Msg.GetRevision()
	if err := h.a.limits.readKey("key", key); err != nil {
		return nil, toConnect(err)
	}
	if rev <= 0 {
		return nil, toConnect(Invalid("revision must be a positive KV revision, got %d", rev))
	}
	out := &tenurev1.ValidateKeyResponse{}
	err := h.a.node.Read(ctx, false, func(m *statemachine.Machine) error {
		// Before cluster version 5 keys take the global revision.
		out.KvRevision = m.KVRevision()
		if out.KvRevision == 0 {
			out.KvRevision = m.Revision()
		}
		if kv, ok := m.Key(key); ok {
			out.CreateRevision = kv.CreateRevision
		}
		out.Valid = out.CreateRevision > 0 && out.CreateRevision <= rev && rev <= out.KvRevision
		return nil
	})
	if err != nil {
		return nil, toConnect(err)
	}
	return connect.NewResponse(out), nil
}

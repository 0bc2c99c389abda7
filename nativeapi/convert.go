package nativeapi

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/kubelease"
	"github.com/tenurehq/tenure/statemachine"
)

func stamp(unixNano int64) *timestamppb.Timestamp {
	if unixNano == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, unixNano))
}

func dur(nanos int64) *durationpb.Duration {
	if nanos == 0 {
		return nil
	}
	return durationpb.New(time.Duration(nanos))
}

// heartbeats tells when the leader last heard from a session, for
// display. The lessor implements it; followers know nothing.
type heartbeats interface {
	LastHeartbeat(id int64) time.Time
}

func sessionProto(m *statemachine.Machine, s statemachine.Session, hb heartbeats) *tenurev1.Session {
	held, waiting, keys := m.SessionHoldings(s.ID)
	out := &tenurev1.Session{
		Id:       s.ID,
		Identity: s.Identity,
		Ttl:      dur(s.TTL),
		Labels:   s.Labels,
		OpenTime: stamp(s.OpenTime),
		Keys:     int64(keys),
	}
	if t := hb.LastHeartbeat(s.ID); !t.IsZero() {
		out.LastHeartbeat = timestamppb.New(t)
	}
	for _, id := range held {
		out.Leases = append(out.Leases, id.String())
	}
	for _, id := range waiting {
		out.Waiting = append(out.Waiting, id.String())
	}
	return out
}

func leaseProto(m *statemachine.Machine, l statemachine.Lease, hb heartbeats) *tenurev1.Lease {
	out := &tenurev1.Lease{
		Namespace:        l.Namespace,
		Name:             l.Name,
		Capacity:         int32(l.Capacity),
		LeaseTransitions: l.Transitions,
		Labels:           l.Labels,
		LockDelay:        dur(l.LockDelay),
		LockDelayActive:  l.DelayRevision != 0,
		CreateRevision:   l.CreateRevision,
		ModRevision:      l.ModRevision,
		Status:           leaseStatus(&l),
		GcAfter:          dur(l.GCAfter),
		PreferredHolder:  l.PreferredHolder,
	}
	if l.IdleSince != 0 {
		out.DeleteTime = stamp(l.IdleSince + l.GCAfter)
	}
	if e := l.Last; e != nil {
		out.Last = &tenurev1.EndedGrant{
			SessionId:      e.SessionID,
			HolderIdentity: e.Holder,
			Token:          e.Token,
			AcquireTime:    stamp(e.AcquireTime),
			RenewTime:      stamp(e.RenewTime),
			EndTime:        stamp(e.EndTime),
			Ended:          string(e.Ended),
			Reason:         e.Reason,
		}
	}
	for i, g := range l.Holders {
		// The renew time is the session's last renewal on this leader,
		// which times its expiry: later than the logged grant time only
		// once a heartbeat follows the grant. Unknown (a follower, or a
		// new leader not yet heard from), it is the logged time.
		renew := g.RenewTime
		if t := hb.LastHeartbeat(g.SessionID); !t.IsZero() {
			renew = t.UnixNano()
		}
		out.Holders = append(out.Holders, &tenurev1.Grant{
			SessionId:      g.SessionID,
			HolderIdentity: g.Holder,
			Token:          g.Token,
			AcquireTime:    stamp(g.AcquireTime),
			RenewTime:      stamp(renew),
			Value:          g.Value,
			Exclusive:      g.Exclusive,
			StepDown:       g.StepDown,
		})
		if i == 0 {
			out.MaxHold = dur(g.MaxHold)
			out.HolderIdentity = g.Holder
			out.FencingToken = g.Token
			out.AcquireTime = stamp(g.AcquireTime)
			out.RenewTime = stamp(renew)
			out.Value = g.Value
			if s, ok := m.Session(g.SessionID); ok {
				out.LeaseDuration = dur(s.TTL)
			}
		}
	}
	for _, w := range l.Waiters {
		out.Waiters = append(out.Waiters, &tenurev1.Waiter{SessionId: w.SessionID, HolderIdentity: w.Holder, Since: stamp(w.Since), Exclusive: w.Exclusive})
	}
	return out
}

// Lease statuses, as Lease.status names them.
const (
	statusHeld    = "held"
	statusWaiting = "waiting" // waiters and no holder: a lock-delay
	statusFree    = "free"    // never granted, and nobody waits
)

func leaseStatus(l *statemachine.Lease) string {
	switch {
	case len(l.Holders) > 0:
		return statusHeld
	case len(l.Waiters) > 0:
		return statusWaiting
	case l.Last != nil:
		return string(l.Last.Ended)
	}
	return statusFree
}

func kvProto(kv *statemachine.KeyValue) *tenurev1.KeyValue {
	if kv == nil {
		return nil
	}
	out := &tenurev1.KeyValue{
		Key:            api.EscapeNonUTF8(kv.Key),
		Value:          api.EscapeNonUTF8(kv.Value),
		CreateRevision: kv.CreateRevision,
		ModRevision:    kv.ModRevision,
		Version:        kv.Version,
		Ttl:            dur(kv.TTL),
		SessionId:      kv.SessionID,
	}
	// A proto string holds only UTF-8: a key or value written as other
	// bytes through the etcd API comes exactly in the bytes fields, and
	// escaped in the strings, which would otherwise fail to marshal.
	if out.Key != kv.Key {
		out.KeyBytes = []byte(kv.Key)
	}
	if out.Value != kv.Value {
		out.ValueBytes = []byte(kv.Value)
	}
	return out
}

var leaseEventTypes = map[statemachine.EventType]tenurev1.LeaseEventType{
	statemachine.EventLeaseAcquired:   tenurev1.LeaseEventType_LEASE_EVENT_TYPE_ACQUIRED,
	statemachine.EventLeaseReleased:   tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED,
	statemachine.EventLeaseReleasedBy: tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED,
	statemachine.EventLeaseExpired:    tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED,
	statemachine.EventLeaseRevoked:    tenurev1.LeaseEventType_LEASE_EVENT_TYPE_REVOKED,
	statemachine.EventLeaseWaiting:    tenurev1.LeaseEventType_LEASE_EVENT_TYPE_WAITING,
	statemachine.EventLeaseWaitEnded:  tenurev1.LeaseEventType_LEASE_EVENT_TYPE_WAIT_ENDED,
	statemachine.EventLeaseValueSet:   tenurev1.LeaseEventType_LEASE_EVENT_TYPE_VALUE_SET,
	statemachine.EventLockDelayEnded:  tenurev1.LeaseEventType_LEASE_EVENT_TYPE_LOCK_DELAY_ENDED,
	statemachine.EventLeaseDeleted:    tenurev1.LeaseEventType_LEASE_EVENT_TYPE_DELETED,
	statemachine.EventLeaseStepDown:   tenurev1.LeaseEventType_LEASE_EVENT_TYPE_STEP_DOWN,
	statemachine.EventLeasePreferred:  tenurev1.LeaseEventType_LEASE_EVENT_TYPE_PREFERRED_HOLDER_SET,
}

// leaseEventProto renders e for a lease watch; kubeKeys is the prefix
// of the Kubernetes Leases' keys the watch follows ("" for none).
func leaseEventProto(e *statemachine.Event, kubeKeys string) *tenurev1.LeaseEvent {
	if key, ok := kubernetesEventKey(e, kubeKeys); ok {
		ns, name, _ := kubelease.ParseKey(kubeKeys, key)
		return &tenurev1.LeaseEvent{
			Revision:  e.Revision,
			Type:      tenurev1.LeaseEventType_LEASE_EVENT_TYPE_KUBERNETES_LEASE,
			Kind:      KubernetesKind,
			Namespace: KubernetesName(ns),
			Name:      KubernetesName(name),
			Key:       []byte(key),
			Time:      stamp(e.Time),
		}
	}
	if pfx, ok := recipeEventPrefix(e); ok {
		return &tenurev1.LeaseEvent{
			Revision:  e.Revision,
			Type:      tenurev1.LeaseEventType_LEASE_EVENT_TYPE_ETCD_LOCK,
			Kind:      RecipeKind,
			Name:      RecipeName(pfx),
			KeyPrefix: []byte(pfx),
			SessionId: e.SessionID,
			Time:      stamp(e.Time),
		}
	}
	return &tenurev1.LeaseEvent{
		Revision:       e.Revision,
		Type:           leaseEventTypes[e.Type],
		Namespace:      e.Lease.Namespace,
		Name:           e.Lease.Name,
		SessionId:      e.SessionID,
		HolderIdentity: e.Holder,
		Token:          e.Token,
		Value:          e.Value,
		Reason:         e.Reason,
		Time:           stamp(e.Time),
	}
}

var keyEventTypes = map[statemachine.EventType]tenurev1.WatchEventType{
	statemachine.EventKeyPut:     tenurev1.WatchEventType_WATCH_EVENT_TYPE_PUT,
	statemachine.EventKeyDeleted: tenurev1.WatchEventType_WATCH_EVENT_TYPE_DELETE,
	statemachine.EventKeyExpired: tenurev1.WatchEventType_WATCH_EVENT_TYPE_EXPIRE,
}

func keyEventProto(e *statemachine.Event) *tenurev1.WatchEvent {
	return &tenurev1.WatchEvent{
		Revision: e.Revision,
		Type:     keyEventTypes[e.Type],
		Kv:       kvProto(e.KV),
		PrevKv:   kvProto(e.PrevKV),
	}
}

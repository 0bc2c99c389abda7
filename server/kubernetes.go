package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/kubelease"
	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/statemachine"
)

// kubeTracker follows the Kubernetes Leases kube-apiserver stores here
// (statemachine.KubernetesLeases) through the applied key events, for
// what a listing of them cannot say: that a holder changed. Each change
// — a holder named where none was (acquire), another one named
// (handover), the holder cleared or the Lease deleted (release) — is
// counted in the per-lease metrics, under the namespace label
// "(kubernetes)/<namespace>", and written as one audit line.
//
// Why the audit line is written by the leader alone: every node applies
// the same events, and a line per node would say one handover as many
// times as there are nodes. The node that is the promoted leader when
// it applies the event writes it, to the audit trail with a policy and
// to the log's audit lines without one, as max hold's revokes are
// (auditor). At a change of leader both may believe they lead for a
// moment, or neither, so a line may come twice or not at all then; a
// replayed entry (a restart) is applied before the node leads, and was
// audited by whoever led when it was first applied.
//
// Why here and not in the replicated state: nothing about these keys is
// Tenure's; the Lease says its own holder and times. The index is what
// the events last left of each Lease's key: its holder and acquire time,
// a few strings per key, and each event costs a map lookup.
type kubeTracker struct {
	prefix  string // kube-apiserver's --etcd-prefix; "" is off
	keys    string // kubelease.KeysPrefix(prefix)
	metrics *leaseMetrics
	// audit writes one holder change; leading tells whether this node
	// is the promoted leader.
	audit   func(auth.Entry)
	leading func() bool

	mu     sync.Mutex                 // guards leases
	leases map[string]kubelease.Lease // by key
}

// kubernetesNamespacePrefix starts the metrics' namespace label of a
// Kubernetes Lease, kubernetesNamespace: no Tenure namespace can be
// called so (api.ValidateNamespace refuses parentheses), and the audit
// trail names its target so too. Its series share --metrics-lease-names
// and recipeKeep with the etcd locks'.
const kubernetesNamespacePrefix = "(kubernetes)/"

// kubernetesNamespace is that label for Kubernetes namespace ns.
func kubernetesNamespace(ns string) string {
	return kubernetesNamespacePrefix + nativeapi.KubernetesName(ns)
}

func newKubeTracker(prefix string, lm *leaseMetrics, audit func(auth.Entry), leading func() bool) *kubeTracker {
	kt := &kubeTracker{metrics: lm, audit: audit, leading: leading, leases: map[string]kubelease.Lease{}}
	if prefix != "" {
		kt.prefix, kt.keys = prefix, kubelease.KeysPrefix(prefix)
	}
	return kt
}

// reset starts again from m, the state a snapshot restore just put in
// place, under the state's write lock before any command applies to it
// (as recipeTracker.reset).
func (kt *kubeTracker) reset(m *statemachine.Machine) {
	if kt.keys == "" {
		return
	}
	kt.mu.Lock()
	defer kt.mu.Unlock()
	clear(kt.leases)
	if m == nil {
		return
	}
	for _, l := range m.KubernetesLeases(kt.prefix) {
		kt.leases[l.Key] = l.Lease
	}
}

// observe follows one command's key events. It runs on the FSM
// goroutine under the state write lock (Server.observe), after the
// command. Maps, counters and, on the leader, a log line.
func (kt *kubeTracker) observe(events []statemachine.Event) {
	if kt.keys == "" {
		return
	}
	kt.mu.Lock()
	defer kt.mu.Unlock()
	for i := range events {
		e := &events[i]
		if e.KV == nil {
			continue
		}
		ns, name, ok := kubelease.ParseKey(kt.keys, e.KV.Key)
		if !ok {
			continue
		}
		before, had := kt.leases[e.KV.Key] // zero: no holder
		var after statemachine.KubernetesLease
		var is bool
		if e.Type == statemachine.EventKeyPut {
			after, is = statemachine.KubernetesLeaseOf(kt.keys, e.KV)
		}
		if is {
			kt.leases[e.KV.Key] = after.Lease
		} else {
			delete(kt.leases, e.KV.Key)
		}
		switch {
		case before.HolderIdentity != after.HolderIdentity:
			kt.handoverLocked(ns, name, e, before, after.Lease, is)
		case had && !is:
			// An unheld Lease gone: no holder changed, but its series
			// go --lease-gc-after from now, as an etcd lock's.
			kt.metrics.derivedHandover(kt.id(ns, name), recipeChange{time: e.Time, idle: true})
		}
	}
}

func (kt *kubeTracker) id(ns, name string) statemachine.LeaseID {
	return statemachine.LeaseID{Namespace: kubernetesNamespace(ns), Name: nativeapi.KubernetesName(name)}
}

// handoverLocked counts and audits the holder change event e made of
// the Lease of namespace ns and name, from before to after (exists:
// the key still holds a Lease).
func (kt *kubeTracker) handoverLocked(ns, name string, e *statemachine.Event, before, after kubelease.Lease, exists bool) {
	at := time.Unix(0, e.Time)
	id := kt.id(ns, name)
	held := before.HolderIdentity != ""
	c := recipeChange{
		time:  e.Time,
		ended: held,
		// A holder taken over after it let its lease run out lost it,
		// as a Tenure session that expired.
		expired: held && before.Expired(at),
		granted: after.HolderIdentity != "",
		idle:    !exists,
	}
	if held && !before.AcquireTime.IsZero() {
		c.heldSince = before.AcquireTime.UnixNano()
	}
	kt.metrics.derivedHandover(id, c)
	if !kt.leading() {
		return
	}
	action := "kubernetes.lease.handover"
	switch {
	case !held:
		action = "kubernetes.lease.acquire"
	case after.HolderIdentity == "":
		action = "kubernetes.lease.release"
	}
	reason := fmt.Sprintf("holder %q -> %q at revision %d", nativeapi.KubernetesName(before.HolderIdentity), nativeapi.KubernetesName(after.HolderIdentity), e.KV.ModRevision)
	switch {
	case !exists:
		reason += ", the Lease deleted"
	case c.expired:
		reason += fmt.Sprintf(", the previous holder's lease expired (renewed %s, for %ds); transitions %d", before.RenewTime.Format(time.RFC3339Nano), before.LeaseDurationSeconds, after.LeaseTransitions)
	default:
		reason += fmt.Sprintf("; transitions %d", after.LeaseTransitions)
	}
	kt.audit(auth.Entry{Principal: "(server)", Action: action, Target: id.Namespace + "/" + id.Name, Outcome: "allowed", Reason: reason})
}

// gauges returns the Kubernetes Leases of m as the per-lease gauges
// need them: held by one while a holder is named and its lease has not
// run out, since its acquire time.
func (kt *kubeTracker) gauges(m *statemachine.Machine, now time.Time) []recipeGauge {
	if kt.keys == "" {
		return nil
	}
	var out []recipeGauge
	for _, l := range m.KubernetesLeases(kt.prefix) {
		g := recipeGauge{id: kt.id(l.Namespace, l.Name)}
		if l.HolderIdentity != "" && !l.Expired(now) {
			g.holders = 1
			if !l.AcquireTime.IsZero() {
				g.since = l.AcquireTime.UnixNano()
			}
		}
		out = append(out, g)
	}
	return out
}

// kubeAudit writes an entry to s.auditor() with no caller to name.
func (s *Server) kubeAudit(e auth.Entry) { s.auditor().Record(context.Background(), e) }

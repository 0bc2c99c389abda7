package server

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenurehq/tenure/nativeapi"
	"github.com/tenurehq/tenure/statemachine"
)

// Per-lease metrics: how long sessions wait for a lease and hold it, how
// often it is granted, expires, is revoked or its holder asked to step
// down, and how many hold and wait now. Every node counts the events it
// applies, so every node reports the same counts: aggregate across nodes
// with max, not sum.
//
// Series carry the lease's namespace, and its name while fewer than
// --metrics-lease-names leases have series of their own; every lease
// after that, whoever created it and however it is labelled, is counted
// under lease="(other)". Names come and go (per-pod, per-job locks), and
// one series set per name ever seen would grow without bound: a lease's
// series are deleted when its idle record is collected, which frees its
// slot for the next name. (A lease labelled tenure.dev/metrics=lease once
// had series of its own past the cap, which let one principal grow
// /metrics without bound; the label no longer does anything.)

const otherLeases = "(other)"

// recipeNamespace is the namespace label of etcd's recipe locks (a
// Mutex, an Election, etcdctl lock): their lease label is the recipe's
// name (nativeapi.RecipeName). No namespace can be called so
// (api.ValidateNamespace), so their series never mix with a lease's.
// They share --metrics-lease-names with the leases, and keep their
// series for --lease-gc-after once the last contender left, as an idle
// lease record stays that long: a lock taken and let go between two
// scrapes is still counted.
const recipeNamespace = "(etcd)"

type leaseMetrics struct {
	wait, hold                    *prometheus.HistogramVec
	grants, expired, lost         *prometheus.CounterVec
	revoked, stepDowns, collected *prometheus.CounterVec

	// start is when this process began: events applied with an earlier
	// time are replayed from the log, and were counted by whoever ran
	// then. Counting them again would show a burst at every restart.
	start int64

	mu sync.Mutex // guards the maps below
	// named are the leases with series of their own, at most cap, first
	// come; a lease leaves when its record is collected.
	named map[statemachine.LeaseID]bool
	cap   int
	since map[waitKey]int64 // when each waiting session began to wait (the waiters' key)
	holds map[int64]int64   // each grant's acquire time, by token
	// born holds the (namespace, lease) label pairs whose series exist:
	// each is created at 0 when first named, so that rate() sees its
	// first event, which a series born at 1 would hide.
	born map[[2]string]bool
	// recipeIdle is when each named recipe lock lost its last
	// contender; recipeKeep how long its series stay after (0: always).
	recipeIdle map[statemachine.LeaseID]int64
	recipeKeep time.Duration
}

func newLeaseMetrics(reg prometheus.Registerer, nameCap int) *leaseMetrics {
	labels := []string{"namespace", "lease"}
	lm := &leaseMetrics{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tenure_lease_wait_seconds",
			Help:    "How long sessions waited in a lease's queue before they were granted it.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 12), // 5ms .. 6h
		}, labels),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tenure_lease_hold_seconds",
			Help:    "How long grants of a lease were held, however they ended.",
			Buckets: prometheus.ExponentialBuckets(0.1, 4, 12), // 100ms .. 5d
		}, labels),
		grants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lease_grants_total",
			Help: "Grants of a lease (each is a new fencing token).",
		}, labels),
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lease_expirations_total",
			Help: "Grants of a lease that ended because their session expired.",
		}, labels),
		revoked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lease_revocations_total",
			Help: "Grants of a lease revoked, by cause: operator, or max_hold (held past its max hold and grace).",
		}, append(labels, "cause")),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lease_lost_grants_total",
			Help: "Grants of a lease that ended without their holder letting go: expired or revoked.",
		}, labels),
		stepDowns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lease_step_downs_total",
			Help: "Holders of a lease asked to step down, by cause: preferred_holder or max_hold.",
		}, append(labels, "cause")),
		collected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lease_records_collected_total",
			Help: "Idle lease records deleted after their gc_after, by namespace.",
		}, []string{"namespace"}),
		start: time.Now().UnixNano(),
		named: map[statemachine.LeaseID]bool{},
		cap:   nameCap,
		since: map[waitKey]int64{},
		holds: map[int64]int64{},
		born:  map[[2]string]bool{},

		recipeIdle: map[statemachine.LeaseID]int64{},
	}
	if reg != nil {
		reg.MustRegister(lm.wait, lm.hold, lm.grants, lm.expired, lm.revoked, lm.lost, lm.stepDowns, lm.collected)
	}
	return lm
}

// nameLocked is the lease label of id's series.
func (lm *leaseMetrics) nameLocked(id statemachine.LeaseID) string {
	if lm.named[id] {
		return id.Name
	}
	if len(lm.named) < lm.cap {
		lm.named[id] = true
		return id.Name
	}
	return otherLeases
}

// observe counts one command's events. It runs on the FSM goroutine
// under the state lock: maps and counters only.
func (lm *leaseMetrics) observe(events []statemachine.Event) {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	for i := range events {
		e := &events[i]
		if !e.Type.IsLease() {
			continue
		}
		id := e.Lease
		fresh := e.Time >= lm.start
		if e.Type == statemachine.EventLeaseDeleted {
			// Before naming it, or a collected lease would take a slot.
			lm.forgetLocked(id)
			if fresh {
				lm.collected.WithLabelValues(id.Namespace).Inc()
			}
			continue
		}
		name := lm.nameLocked(id)
		lm.bearLocked(id.Namespace, name)
		switch e.Type {
		case statemachine.EventLeaseWaiting:
			lm.since[waitKey{session: e.SessionID, lease: id}] = e.Time
		case statemachine.EventLeaseWaitEnded:
			delete(lm.since, waitKey{session: e.SessionID, lease: id})
		case statemachine.EventLeaseAcquired:
			lm.holds[e.Token] = e.Time
			k := waitKey{session: e.SessionID, lease: id}
			if t, ok := lm.since[k]; ok {
				delete(lm.since, k)
				if fresh {
					lm.wait.WithLabelValues(id.Namespace, name).Observe(seconds(e.Time - t))
				}
			}
			if fresh {
				lm.grants.WithLabelValues(id.Namespace, name).Inc()
			}
		case statemachine.EventLeaseReleased, statemachine.EventLeaseReleasedBy,
			statemachine.EventLeaseExpired, statemachine.EventLeaseRevoked:
			t, ok := lm.holds[e.Token]
			delete(lm.holds, e.Token)
			if !fresh {
				continue
			}
			if ok {
				lm.hold.WithLabelValues(id.Namespace, name).Observe(seconds(e.Time - t))
			}
			switch e.Type {
			case statemachine.EventLeaseExpired:
				lm.expired.WithLabelValues(id.Namespace, name).Inc()
				lm.lost.WithLabelValues(id.Namespace, name).Inc()
			case statemachine.EventLeaseRevoked:
				lm.revoked.WithLabelValues(id.Namespace, name, causeOf(e.Reason, "operator")).Inc()
				lm.lost.WithLabelValues(id.Namespace, name).Inc()
			}
		case statemachine.EventLeaseStepDown:
			if fresh {
				lm.stepDowns.WithLabelValues(id.Namespace, name, causeOf(e.Reason, "preferred_holder")).Inc()
			}
		}
	}
}

// recipeChange is a handover of an etcd recipe lock (recipeTracker),
// at time: its holder's hold ended (held since heldSince, 0: unknown;
// expired with its session), a next holder was granted (after waiting
// since waitedSince, 0: it did not wait or nobody knows since when), or
// nobody is left (idle).
type recipeChange struct {
	time           int64
	ended, expired bool
	heldSince      int64
	granted        bool
	waitedSince    int64
	idle           bool
}

// recipeHandover counts a handover of the recipe lock of prefix pfx.
// It runs on the FSM goroutine under the state lock, as observe does.
func (lm *leaseMetrics) recipeHandover(pfx string, c recipeChange) {
	lm.derivedHandover(statemachine.LeaseID{Namespace: recipeNamespace, Name: nativeapi.RecipeName(pfx)}, c)
}

// derivedNamespace reports whether ns is the namespace label of leases
// read from keys — etcd's recipe locks, Kubernetes Leases — rather than
// of Tenure's records: their series stay recipeKeep after they go.
func derivedNamespace(ns string) bool {
	return ns == recipeNamespace || strings.HasPrefix(ns, kubernetesNamespacePrefix)
}

// derivedHandover counts a handover of id, an etcd recipe lock or a
// Kubernetes Lease (kubeTracker).
func (lm *leaseMetrics) derivedHandover(id statemachine.LeaseID, c recipeChange) {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	name := lm.nameLocked(id)
	ns := id.Namespace
	if k := [2]string{ns, name}; !lm.born[k] {
		// Only what an etcd lock or a Kubernetes Lease can do: nobody
		// revokes a grant of it, asks its holder to step down or
		// collects a record.
		lm.born[k] = true
		for _, v := range []*prometheus.CounterVec{lm.grants, lm.expired, lm.lost} {
			v.WithLabelValues(ns, name)
		}
	}
	if c.idle {
		lm.recipeIdle[id] = c.time
	} else {
		delete(lm.recipeIdle, id)
	}
	if c.time < lm.start {
		return // replayed: counted by whoever ran then
	}
	if c.ended && c.heldSince != 0 {
		lm.hold.WithLabelValues(ns, name).Observe(seconds(c.time - c.heldSince))
	}
	if c.expired {
		lm.expired.WithLabelValues(ns, name).Inc()
		lm.lost.WithLabelValues(ns, name).Inc()
	}
	if c.granted {
		lm.grants.WithLabelValues(ns, name).Inc()
		if c.waitedSince != 0 {
			lm.wait.WithLabelValues(ns, name).Observe(seconds(c.time - c.waitedSince))
		}
	}
}

// bearLocked creates the counter series of (ns, name) at 0, once.
func (lm *leaseMetrics) bearLocked(ns, name string) {
	k := [2]string{ns, name}
	if lm.born[k] {
		return
	}
	lm.born[k] = true
	for _, v := range []*prometheus.CounterVec{lm.grants, lm.expired, lm.lost} {
		v.WithLabelValues(ns, name)
	}
	lm.revoked.WithLabelValues(ns, name, "operator")
	lm.revoked.WithLabelValues(ns, name, "max_hold")
	lm.stepDowns.WithLabelValues(ns, name, "preferred_holder")
	lm.stepDowns.WithLabelValues(ns, name, "max_hold")
	lm.collected.WithLabelValues(ns)
}

// forgetLocked deletes the series of id, whose record is gone, and frees
// its slot under the cap. A lease counted under (other) has none.
func (lm *leaseMetrics) forgetLocked(id statemachine.LeaseID) {
	if !lm.named[id] {
		return
	}
	delete(lm.named, id)
	delete(lm.born, [2]string{id.Namespace, id.Name})
	for _, v := range []*prometheus.HistogramVec{lm.wait, lm.hold} {
		v.DeleteLabelValues(id.Namespace, id.Name)
	}
	for _, v := range []*prometheus.CounterVec{lm.grants, lm.expired, lm.lost} {
		v.DeleteLabelValues(id.Namespace, id.Name)
	}
	// These have a cause label too.
	for _, v := range []*prometheus.CounterVec{lm.revoked, lm.stepDowns} {
		v.DeletePartialMatch(prometheus.Labels{"namespace": id.Namespace, "lease": id.Name})
	}
}

// causeOf is max_hold for the server's max-hold reasons, else other.
func causeOf(reason, other string) string {
	if strings.HasPrefix(reason, maxHoldReason) {
		return "max_hold"
	}
	return other
}

func seconds(nanos int64) float64 { return max(time.Duration(nanos), 0).Seconds() }

// recipeGauge is an etcd recipe lock or a Kubernetes Lease as the
// gauges need it: held by holders, queued waiting, held since since (0:
// unknown, which counts as 0s).
type recipeGauge struct {
	id      statemachine.LeaseID // its namespace and lease labels
	holders int                  // 1 for an etcd lock
	queued  int
	since   int64
}

// Per-lease gauges, read from the state at scrape time.
var (
	leaseHoldersDesc = prometheus.NewDesc("tenure_lease_holders", "Sessions holding a lease now.", []string{"namespace", "lease"}, nil)
	leaseQueuedDesc  = prometheus.NewDesc("tenure_lease_queued", "Sessions waiting in a lease's queue now.", []string{"namespace", "lease"}, nil)
	leaseHeldDesc    = prometheus.NewDesc("tenure_lease_held_seconds", "How long the oldest current grant of a lease has been held: a stuck holder shows as a line that keeps rising.", []string{"namespace", "lease"}, nil)
)

// collectGauges sends the per-lease gauges, leases past the cap summed
// under (other) (held_seconds: their longest). leases are all the state
// holds: a named lease not among them left it without a deleted event
// reaching observe (a follower restored a snapshot taken after its
// collection), and its series go now.
//
// recipes are etcd's recipe locks and Kubernetes' Leases now, named by
// nativeapi.RecipeName and kubernetesNamespace: a named one not among
// them keeps its series until it has been gone for recipeKeep.
func (lm *leaseMetrics) collectGauges(leases []statemachine.Lease, recipes []recipeGauge, now time.Time, ch chan<- prometheus.Metric) {
	type key struct{ ns, name string }
	type agg struct{ holders, queued, held float64 }
	out := map[key]*agg{}
	lm.mu.Lock()
	present := make(map[statemachine.LeaseID]bool, len(lm.named))
	for _, l := range leases {
		if lm.named[l.LeaseID] {
			present[l.LeaseID] = true
		}
	}
	for _, r := range recipes {
		present[r.id] = true
	}
	for id := range lm.named {
		switch {
		case present[id]:
			delete(lm.recipeIdle, id)
		case !derivedNamespace(id.Namespace):
			lm.forgetLocked(id)
		case lm.recipeIdle[id] == 0:
			lm.recipeIdle[id] = now.UnixNano() // gone before this process saw it go
		case lm.recipeKeep > 0 && now.Sub(time.Unix(0, lm.recipeIdle[id])) >= lm.recipeKeep:
			delete(lm.recipeIdle, id)
			lm.forgetLocked(id)
		}
	}
	for _, l := range leases {
		k := key{l.Namespace, lm.nameLocked(l.LeaseID)}
		a := out[k]
		if a == nil {
			a = &agg{}
			out[k] = a
		}
		a.holders += float64(len(l.Holders))
		a.queued += float64(len(l.Waiters))
		for _, g := range l.Holders {
			a.held = max(a.held, now.Sub(time.Unix(0, g.AcquireTime)).Seconds())
		}
	}
	for _, r := range recipes {
		k := key{r.id.Namespace, lm.nameLocked(r.id)}
		a := out[k]
		if a == nil {
			a = &agg{}
			out[k] = a
		}
		a.holders += float64(r.holders)
		a.queued += float64(r.queued)
		if r.since != 0 {
			a.held = max(a.held, now.Sub(time.Unix(0, r.since)).Seconds())
		}
	}
	lm.mu.Unlock()
	for k, a := range out {
		ch <- prometheus.MustNewConstMetric(leaseHoldersDesc, prometheus.GaugeValue, a.holders, k.ns, k.name)
		ch <- prometheus.MustNewConstMetric(leaseQueuedDesc, prometheus.GaugeValue, a.queued, k.ns, k.name)
		ch <- prometheus.MustNewConstMetric(leaseHeldDesc, prometheus.GaugeValue, a.held, k.ns, k.name)
	}
}

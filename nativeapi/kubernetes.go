package nativeapi

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/kubelease"
	"github.com/tenurehq/tenure/statemachine"
)

// KubernetesKind is Lease.kind for a coordination.k8s.io Lease of the
// Kubernetes cluster whose kube-apiserver stores its objects in this
// Tenure (statemachine.KubernetesLeases): its leader elections, its
// apiservers' identities, its nodes' heartbeats. They are listed with
// the leases so that the page, `tenure get lease -A` and a program see
// who leads kube-scheduler and which kubelet stopped renewing, beside
// the leases of Tenure's own clients.
//
// As for RecipeKind, kind tells them apart, not a namespace: a Tenure
// lease kube-system/kube-scheduler and the Kubernetes one are two
// leases, and the lease calls (Acquire, Release, Revoke, ...) only ever
// name the Tenure one. A Kubernetes Lease is read-only here; it changes
// when kube-apiserver writes its key.
const KubernetesKind = "kubernetes"

// Kubernetes Lease statuses beside the Tenure ones: a holder named but
// past renew_time + lease_duration; no holder named.
const (
	statusExpired  = "expired"
	statusReleased = "released"
)

// KubernetesName is the printable form of a Kubernetes Lease's
// namespace or name as its key holds them (any bytes through the etcd
// API; kube-apiserver writes DNS labels): RecipeName's escaping.
func KubernetesName(s string) string { return printable(s) }

// kubernetesLeaseProto renders l as a Lease of kind KubernetesKind, its
// status judged at now.
func kubernetesLeaseProto(l statemachine.KubernetesLease, now time.Time) *tenurev1.Lease {
	out := &tenurev1.Lease{
		Kind:             KubernetesKind,
		Namespace:        KubernetesName(l.Namespace),
		Name:             KubernetesName(l.Name),
		Key:              []byte(l.Key),
		ResourceVersion:  l.ModRevision,
		HolderIdentity:   api.EscapeNonUTF8(l.HolderIdentity),
		LeaseTransitions: int64(l.LeaseTransitions),
		PreferredHolder:  api.EscapeNonUTF8(l.PreferredHolder),
		AcquireTime:      kubeStamp(l.AcquireTime),
		RenewTime:        kubeStamp(l.RenewTime),
		Capacity:         1,
		Status:           kubernetesStatus(l.Lease, now),
	}
	if l.LeaseDurationSeconds > 0 {
		out.LeaseDuration = dur(int64(l.LeaseDurationSeconds) * int64(time.Second))
	}
	return out
}

// kubernetesStatus is how l stands at now, as client-go judges it.
func kubernetesStatus(l kubelease.Lease, now time.Time) string {
	switch {
	case l.HolderIdentity == "":
		return statusReleased
	case l.Expired(now):
		return statusExpired
	}
	return statusHeld
}

// kubeStamp is t, unset when zero. Not stamp: a value may carry any
// time from year 1 to 9999, past what nanoseconds since 1970 hold.
func kubeStamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

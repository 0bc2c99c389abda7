package cluster

import (
	"fmt"
	"time"
)

// KubeLeaseJSON is a coordination.k8s.io/v1 Lease as kube-apiserver
// stores it with --storage-media-type=application/json, for tests that
// write one through the etcd API (WithEtcd, WithKubernetesPrefix).
func KubeLeaseJSON(ns, name, holder string, seconds, transitions int, acquire, renew time.Time) string {
	const micro = "2006-01-02T15:04:05.000000Z07:00"
	return fmt.Sprintf(`{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":%q,"namespace":%q},"spec":{"holderIdentity":%q,"leaseDurationSeconds":%d,"acquireTime":%q,"renewTime":%q,"leaseTransitions":%d}}`,
		name, ns, holder, seconds, acquire.UTC().Format(micro), renew.UTC().Format(micro), transitions)
}

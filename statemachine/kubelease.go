package statemachine

import (
	"strings"
	"unsafe"

	"github.com/tenurehq/tenure/kubelease"
)

// Kubernetes keeps its own leases — the scheduler's and the controller
// manager's leader election, each apiserver's identity, each node's
// heartbeat — as keys kube-apiserver writes through the etcd API:
// <prefix>/leases/<namespace>/<name>. KubernetesLeases reads them back,
// so that they can be shown as leases are. Like RecipeLocks it is a read:
// nothing is replicated, and the keys behave as any other.

// KubernetesLease is a Kubernetes Lease as its key holds it.
type KubernetesLease struct {
	Key string
	// Namespace and Name are the key's segments, any bytes: the key is
	// what a reader is allowed, and what kube-apiserver addresses.
	Namespace, Name string
	// The key's KV revisions (etcd's).
	CreateRevision, ModRevision int64
	kubelease.Lease
}

// KubernetesLeaseOf decodes kv, a key under keysPrefix
// (kubelease.KeysPrefix), and reports whether it holds a Lease: a key
// of the shape <namespace>/<name> whose value decodes, naming that very
// namespace and name. A value whose metadata names another lease is not
// one kube-apiserver wrote, and is not shown under a name it lies about.
func KubernetesLeaseOf(keysPrefix string, kv *KeyValue) (KubernetesLease, bool) {
	ns, name, ok := kubelease.ParseKey(keysPrefix, kv.Key)
	if !ok {
		return KubernetesLease{}, false
	}
	// Decode reads the value in place: it neither modifies nor keeps its
	// argument, and a listing would otherwise copy every value under the
	// prefix, however large anyone who may write there made it.
	l, ok := kubelease.Decode(unsafe.Slice(unsafe.StringData(kv.Value), len(kv.Value)))
	if !ok || (l.Namespace != "" && l.Namespace != ns) || (l.Name != "" && l.Name != name) {
		return KubernetesLease{}, false
	}
	return KubernetesLease{Key: kv.Key, Namespace: ns, Name: name, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Lease: l}, true
}

// KubernetesLeases returns the Leases kube-apiserver, run with
// --etcd-prefix prefix, stores, in key order: a range over the keys
// under kubelease.KeysPrefix(prefix), never a walk of the keyspace.
// Keys there that hold no Lease (KubernetesLeaseOf) are skipped. Callers
// read it under the state's read lock like every other read.
func (m *Machine) KubernetesLeases(prefix string) []KubernetesLease {
	pfx := kubelease.KeysPrefix(prefix)
	var out []KubernetesLease
	m.keys.AscendGreaterOrEqual(&KeyValue{Key: pfx}, func(kv *KeyValue) bool {
		if !strings.HasPrefix(kv.Key, pfx) {
			return false
		}
		if l, ok := KubernetesLeaseOf(pfx, kv); ok {
			out = append(out, l)
		}
		return true
	})
	return out
}

package statemachine

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// etcd's concurrency recipes — clientv3's concurrency.Mutex and Election,
// and so etcd's Lock and Election services, etcdctl lock and elect —
// keep no record of their own: each contender puts one key,
// name + "/" + its lease ID in lower-case hex, attached to that lease.
// The key created first holds the lock (leads the election), the others
// wait in create order, and the holder's fencing value is its key's
// create revision. RecipeLocks reads that shape back from the keys, so
// that the lock can be shown as a lease is: nothing here is replicated
// or changes how a key behaves.
//
// A key is a recipe key when its last segment is the hex of the very
// lease it is attached to: a key that merely ends in hex is not one, and
// a key attached to no lease never is. Only keys bound to sessions can
// be, so the derivation walks the sessions' keys, not the keyspace.

// RecipeLock is an etcd recipe's lock as its keys show it.
type RecipeLock struct {
	// Prefix is what the contenders' keys share: the recipe's name and
	// "/". Any bytes.
	Prefix string
	// Contenders are the recipe's keys in create order: the first holds
	// the lock, the rest wait for it.
	Contenders []RecipeContender
}

// RecipeContender is one key of a recipe and the session behind it.
type RecipeContender struct {
	Key            string
	Value          string // an election's proclamation; "" for a mutex
	CreateRevision int64  // the KV revision: the fencing value while it holds
	ModRevision    int64
	SessionID      int64
	EtcdLease      int64 // the key's last segment, in hex
	Identity       string
}

// RecipePrefix returns the prefix under which key, attached to etcd lease
// lease (0: none), contends in an etcd recipe, and whether it is a recipe
// key at all: its last "/"-separated segment must be lease in lower-case
// hex, as the recipes write it (fmt.Sprintf("%x", lease)).
func RecipePrefix(key string, lease int64) (string, bool) {
	if lease <= 0 {
		return "", false
	}
	cut := strings.LastIndexByte(key, '/')
	if cut < 0 || key[cut+1:] != strconv.FormatInt(lease, 16) {
		return "", false
	}
	return key[:cut+1], true
}

// RecipeLocks returns the recipe locks the keys bound to sessions show,
// by prefix. It reads the name of every key bound to a session, and
// looks up only those whose last segment is their lease's hex: cheap
// beside the keyspace, which it never walks. Callers read it under the
// state's read lock like every other read.
func (m *Machine) RecipeLocks() []RecipeLock {
	byPrefix := map[string][]RecipeContender{}
	for _, s := range m.sessions {
		lease := s.EtcdLeaseID() // every key bound to s is attached to it
		for key := range s.keySet() {
			pfx, ok := RecipePrefix(key, lease)
			if !ok {
				continue // most keys: no lookup
			}
			kv, ok := m.keys.Get(&KeyValue{Key: key})
			if !ok || kv.EtcdLease() != lease {
				continue
			}
			byPrefix[pfx] = append(byPrefix[pfx], RecipeContender{
				Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision,
				SessionID: s.ID, EtcdLease: lease, Identity: s.Identity,
			})
		}
	}
	out := make([]RecipeLock, 0, len(byPrefix))
	for _, pfx := range slices.Sorted(maps.Keys(byPrefix)) {
		cs := byPrefix[pfx]
		slices.SortFunc(cs, func(a, b RecipeContender) int {
			return cmp.Or(cmp.Compare(a.CreateRevision, b.CreateRevision), strings.Compare(a.Key, b.Key))
		})
		out = append(out, RecipeLock{Prefix: pfx, Contenders: cs})
	}
	return out
}

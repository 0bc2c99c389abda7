package watch

import (
	"strings"

	"github.com/tenurehq/tenure/statemachine"
)

// KeyFilter accepts key events for key, or for every key starting with key
// when prefix is set (an empty key with prefix accepts every key event).
func KeyFilter(key string, prefix bool) func(*statemachine.Event) bool {
	return func(ev *statemachine.Event) bool {
		if !ev.Type.IsKey() {
			return false
		}
		// Deletes and expiries may carry only the previous value.
		kv := ev.KV
		if kv == nil {
			kv = ev.PrevKV
		}
		if kv == nil {
			return false
		}
		if prefix {
			return strings.HasPrefix(kv.Key, key)
		}
		return kv.Key == key
	}
}

// LeaseFilter accepts lease events in namespace, or in every namespace when
// namespace is empty.
func LeaseFilter(namespace string) func(*statemachine.Event) bool {
	return func(ev *statemachine.Event) bool {
		return ev.Type.IsLease() && (namespace == "" || ev.Lease.Namespace == namespace)
	}
}

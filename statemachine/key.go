package statemachine

import (
	"fmt"
	"strings"
)

func keyLess(a, b *KeyValue) bool { return a.Key < b.Key }

func (m *Machine) put(c Put) Result {
	if c.SessionID != 0 {
		s, ok := m.sessions[c.SessionID]
		if !ok {
			return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
		}
		if err := m.actAs(c.Actor, s, "bind a key to", false); err != nil {
			return Result{Err: err}
		}
	}
	kv, prev := m.putKey(c.Key, c.Value, c.TTL, c.SessionID)
	return Result{KV: kv, PrevKV: prev}
}

func (m *Machine) putKey(key, value string, ttl, sessionID int64) (kv, prev *KeyValue) {
	rev, sub := m.nextKeyRevision()
	next := &KeyValue{Key: key, Value: value, CreateRevision: rev, ModRevision: rev, Version: 1, TTL: ttl, SessionID: sessionID}
	if sessionID != 0 {
		next.LeaseID = m.sessions[sessionID].LeaseID
	}
	old, ok := m.keys.Get(&KeyValue{Key: key})
	if !ok {
		old = nil
	}
	evPrev := m.eventPrev(key, old, rev)
	if ok {
		p := *old
		prev = &p
		next.CreateRevision = old.CreateRevision
		next.Version = old.Version + 1
		if old.SessionID != 0 && old.SessionID != sessionID {
			m.sessions[old.SessionID].unbind(key)
		}
	}
	if sessionID != 0 {
		m.sessions[sessionID].bind(key)
	}
	m.keys.ReplaceOrInsert(next)
	m.usage.Keys += keyCost(next)
	if ok {
		m.usage.Keys -= keyCost(old)
	}
	if m.usesKVRevision() {
		m.recordVersion(&version{Key: key, Main: rev, Sub: sub, KV: next})
		m.usage.History += VersionOverhead
		if ok {
			m.usage.History += keyCost(old) // its version is no longer the key as it is
		}
	}
	out := *next
	m.emit(Event{Type: EventKeyPut, SessionID: sessionID, KV: &out, PrevKV: evPrev})
	return &out, prev
}

func (m *Machine) deleteKey(kv *KeyValue, typ EventType) {
	m.keys.Delete(kv)
	m.usage.Keys -= keyCost(kv)
	if kv.SessionID != 0 {
		if s, ok := m.sessions[kv.SessionID]; ok {
			s.unbind(kv.Key)
		}
	}
	rev, sub := m.nextKeyRevision()
	prev := m.eventPrev(kv.Key, kv, rev)
	if m.usesKVRevision() {
		v := &version{Key: kv.Key, Main: rev, Sub: sub, Expired: typ == EventKeyExpired}
		m.recordVersion(v)
		m.usage.History += keyCost(kv) + versionCost(v, false)
	}
	m.emit(Event{Type: typ, SessionID: kv.SessionID, KV: &KeyValue{Key: kv.Key, ModRevision: rev}, PrevKV: prev})
}

func (m *Machine) delete(c Delete) Result {
	var doomed []*KeyValue
	if c.Prefix {
		m.keys.AscendGreaterOrEqual(&KeyValue{Key: c.Key}, func(kv *KeyValue) bool {
			if !strings.HasPrefix(kv.Key, c.Key) {
				return false
			}
			doomed = append(doomed, kv)
			return true
		})
	} else if kv, ok := m.keys.Get(&KeyValue{Key: c.Key}); ok {
		doomed = append(doomed, kv)
	}
	for _, kv := range doomed {
		m.deleteKey(kv, EventKeyDeleted)
	}
	var prev *KeyValue
	if len(doomed) == 1 && !c.Prefix {
		p := *doomed[0]
		prev = &p
	}
	return Result{Deleted: int64(len(doomed)), PrevKV: prev}
}

func (m *Machine) compareAndSwap(c CompareAndSwap) Result {
	// Refused before the compare, whose failure would say what the key
	// holds.
	if s, ok := m.sessions[c.SessionID]; ok && c.SessionID != 0 && !c.Delete {
		if err := m.actAs(c.Actor, s, "bind a key to", false); err != nil {
			return Result{Err: err}
		}
	}
	cur, exists := m.keys.Get(&KeyValue{Key: c.Key})
	var current *KeyValue
	if exists {
		cp := *cur
		current = &cp
	}
	if err := compare(c, current); err != nil {
		return Result{Err: err, KV: current}
	}
	if c.Delete {
		if exists {
			m.deleteKey(cur, EventKeyDeleted)
			return Result{Deleted: 1, PrevKV: current}
		}
		return Result{}
	}
	if c.SessionID != 0 {
		if _, ok := m.sessions[c.SessionID]; !ok {
			return Result{Err: fmt.Errorf("%w: session %d", ErrSessionNotFound, c.SessionID)}
		}
	}
	kv, prev := m.putKey(c.Key, c.NewValue, c.TTL, c.SessionID)
	return Result{KV: kv, PrevKV: prev}
}

// compare checks a compare-and-swap's condition against the key as it is
// (nil when absent). The error names expected and actual.
func compare(c CompareAndSwap, cur *KeyValue) error {
	switch c.Target {
	case CompareAbsent:
		if cur != nil {
			return fmt.Errorf("%w: key %q exists (mod_revision %d), expected absent", ErrCompareFailed, c.Key, cur.ModRevision)
		}
	case CompareValue:
		if cur == nil {
			return fmt.Errorf("%w: key %q is absent, expected value %q", ErrCompareFailed, c.Key, c.Value)
		}
		if cur.Value != c.Value {
			return fmt.Errorf("%w: value %q != %q for key %q", ErrCompareFailed, c.Value, cur.Value, c.Key)
		}
	case CompareModRevision:
		var actual int64
		if cur != nil {
			actual = cur.ModRevision
		}
		if actual != c.ModRevision {
			return fmt.Errorf("%w: mod_revision %d != %d for key %q", ErrCompareFailed, c.ModRevision, actual, c.Key)
		}
	default:
		return fmt.Errorf("%w: compare target %d", ErrCompareFailed, c.Target)
	}
	return nil
}

func (m *Machine) expireKeys(c ExpireKeys) Result {
	if c.Epoch != m.epoch {
		return Result{}
	}
	for _, k := range c.Keys {
		kv, ok := m.keys.Get(&KeyValue{Key: k.Key})
		if ok && kv.ModRevision == k.ModRevision && kv.TTL > 0 {
			m.deleteKey(kv, EventKeyExpired)
		}
	}
	return Result{}
}

// Key returns a copy of a key.
func (m *Machine) Key(key string) (KeyValue, bool) {
	kv, ok := m.keys.Get(&KeyValue{Key: key})
	if !ok {
		return KeyValue{}, false
	}
	return *kv, true
}

// Range returns up to limit keys (0 = all) with the prefix, sorted, and
// whether more were left out.
func (m *Machine) Range(prefix string, limit int) ([]KeyValue, bool) {
	var out []KeyValue
	more := false
	m.keys.AscendGreaterOrEqual(&KeyValue{Key: prefix}, func(kv *KeyValue) bool {
		if !strings.HasPrefix(kv.Key, prefix) {
			return false
		}
		if limit > 0 && len(out) == limit {
			more = true
			return false
		}
		out = append(out, *kv)
		return true
	})
	return out, more
}

// KeyCount is the number of keys.
func (m *Machine) KeyCount() int { return m.keys.Len() }

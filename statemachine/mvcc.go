package statemachine

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/google/btree"
)

// Keys have a revision of their own, the KV revision, as etcd's keys do:
// it moves once per command that changes keys, however many it changes
// (a Txn's writes share one), and never for sessions, leases or grants.
// The global revision (Revision) still moves once per event and names
// sessions and fencing tokens; the two are different clocks. A key's
// CreateRevision and ModRevision, and the KV of key events, are KV
// revisions from cluster version 5 on. Before it, keys took the global
// revision; the switch starts the KV revision above every one of those,
// so a key's revisions only ever grow.
//
// The versions of keys since the compact revision are kept, so that a
// range or a watch can start in the past, as etcd's MVCC store allows.

// Errors of reads and watches at a revision.
var (
	// ErrCompacted is returned for a revision older than the compact
	// revision: its versions are gone.
	ErrCompacted = errors.New("required revision has been compacted")
	// ErrFutureRevision is returned for a revision the store has not
	// reached.
	ErrFutureRevision = errors.New("required revision is a future revision")
	// ErrLeaseExists is returned when a session is opened with a lease ID
	// that an open session already answers to.
	ErrLeaseExists = errors.New("lease already exists")
)

// version is one change of one key: the key as written, or its deletion
// (KV nil), at a KV revision (Main) and its place in the command (Sub).
type version struct {
	Key  string
	Main int64
	Sub  int64
	KV   *KeyValue
	// Expired marks a deletion by the key's TTL, which the native watch
	// reports as such.
	Expired bool
}

func versionLess(a, b *version) bool {
	if a.Key != b.Key {
		return a.Key < b.Key
	}
	if a.Main != b.Main {
		return a.Main < b.Main
	}
	return a.Sub < b.Sub
}

// history is every version of every key since the compact revision,
// twice indexed: by key then revision for ranges in the past, and in
// revision order for watches that start in the past.
type history struct {
	byKey *btree.BTreeG[*version]
	byRev []*version
}

func newHistory() history {
	return history{byKey: btree.NewG(32, versionLess)}
}

// KVRevision is the KV revision: that of the last command that changed a
// key (etcd's header revision). Before cluster version 5 it is 0.
func (m *Machine) KVRevision() int64 { return m.kvRevision }

// CompactRevision is the oldest KV revision whose versions are kept; -1
// on a store that started at version 5 and was never compacted.
func (m *Machine) CompactRevision() int64 { return m.compactRevision }

// usesKVRevision reports whether keys take KV revisions.
func (m *Machine) usesKVRevision() bool { return m.atLeast(5) }

// startKVRevision switches keys to the KV revision when the cluster
// version reaches 5: it starts above every revision a key has, and the
// history starts with the keys as they are. They are the keys as of the
// revision before, the last the keys took from the global clock, so the
// history starts there, as if compacted at it: on a fresh store that is
// 0, nothing compacted, and a Compact at 1 succeeds, as etcd's does.
func (m *Machine) startKVRevision() {
	m.kvRevision = m.revision + 1
	m.compactRevision = m.revision
	if m.revision == 0 {
		m.compactRevision = -1 // as etcd's: even Compact 0 succeeds
	}
	m.keys.Ascend(func(kv *KeyValue) bool {
		m.recordVersion(&version{Key: kv.Key, Main: kv.ModRevision, KV: kv})
		return true
	})
	// Sorted as a slice of its own: a snapshot still being written may
	// hold the old one (SnapshotSplit), which must not change under it.
	m.history.byRev = slices.Clone(m.history.byRev)
	sort.SliceStable(m.history.byRev, func(i, j int) bool { return revLess(m.history.byRev[i], m.history.byRev[j]) })
}

func revLess(a, b *version) bool {
	if a.Main != b.Main {
		return a.Main < b.Main
	}
	return a.Sub < b.Sub
}

// nextKeyRevision is the revision the command's next key change takes,
// and its place in the command: the first change of a command moves the
// KV revision, the rest share it.
func (m *Machine) nextKeyRevision() (main, sub int64) {
	if !m.usesKVRevision() {
		return m.revision + 1, 0
	}
	if m.kvChanges == 0 {
		m.kvRevision++
	}
	m.kvChanges++
	return m.kvRevision, m.kvChanges - 1
}

func (m *Machine) recordVersion(v *version) {
	m.history.byKey.ReplaceOrInsert(v)
	m.history.byRev = append(m.history.byRev, v)
}

// checkRevision checks that rev (0 = current) can be read.
func (m *Machine) checkRevision(rev int64) error {
	switch {
	case rev <= 0 || rev == m.kvRevision:
		return nil
	case rev > m.kvRevision:
		return fmt.Errorf("%w: %d (current %d)", ErrFutureRevision, rev, m.kvRevision)
	case rev < m.compactRevision:
		return fmt.Errorf("%w: %d (compacted at %d)", ErrCompacted, rev, m.compactRevision)
	}
	return nil
}

// RangeKeys calls fn with copies of the keys in [key, end) as they were
// at KV revision rev (0 or the current revision: as they are), in key
// order, until fn returns false. end "" names key alone; end "\x00"
// means every key from key on, as in etcd.
func (m *Machine) RangeKeys(key, end string, rev int64, fn func(KeyValue) bool) error {
	if err := m.checkRevision(rev); err != nil {
		return err
	}
	if end == "" {
		end = key + "\x00"
	}
	inRange := func(k string) bool { return end == "\x00" || k < end }
	if rev <= 0 || rev == m.kvRevision {
		m.keys.AscendGreaterOrEqual(&KeyValue{Key: key}, func(kv *KeyValue) bool {
			return inRange(kv.Key) && fn(*kv)
		})
		return nil
	}
	// Each key's last version at or before rev, if it is not a deletion.
	var last *version
	emitLast := func() bool {
		if last == nil || last.KV == nil {
			return true
		}
		return fn(*last.KV)
	}
	stopped := false
	m.history.byKey.AscendGreaterOrEqual(&version{Key: key}, func(v *version) bool {
		if !inRange(v.Key) {
			return false
		}
		if last != nil && v.Key != last.Key {
			if !emitLast() {
				stopped = true
				return false
			}
			last = nil
		}
		if v.Main <= rev {
			last = v
		}
		return true
	})
	if !stopped {
		emitLast()
	}
	return nil
}

// KeyEvents calls fn with every key event from KV revision from on, in
// revision order, until fn returns false: the history a watch replays.
// The events carry KV (for a deletion, the key and its revision), PrevKV
// (the version before, if the history holds it) and no global revision.
func (m *Machine) KeyEvents(from int64, fn func(Event) bool) error {
	if from < m.compactRevision {
		return fmt.Errorf("%w: %d (compacted at %d)", ErrCompacted, from, m.compactRevision)
	}
	h := m.history.byRev
	i := sort.Search(len(h), func(i int) bool { return h[i].Main >= from })
	for ; i < len(h); i++ {
		v := h[i]
		e := Event{Type: EventKeyPut, Time: 0}
		if v.KV == nil {
			e.Type = EventKeyDeleted
			if v.Expired {
				e.Type = EventKeyExpired
			}
			e.KV = &KeyValue{Key: v.Key, ModRevision: v.Main}
		} else {
			kv := *v.KV
			e.KV = &kv
			e.SessionID = kv.SessionID
		}
		if prev := m.versionBefore(v); prev != nil && prev.KV != nil {
			kv := *prev.KV
			e.PrevKV = &kv
		}
		if !fn(e) {
			return nil
		}
	}
	return nil
}

// versionBefore is the version of v's key before v's command, if kept:
// etcd's watch reads an event's prev_kv at the revision before it, so a
// key written twice in one Txn has the key as it was before the Txn.
func (m *Machine) versionBefore(v *version) *version { return m.lastBefore(v.Key, v.Main) }

// lastBefore is the last kept version of key below KV revision main.
func (m *Machine) lastBefore(key string, main int64) *version {
	var prev *version
	m.history.byKey.DescendLessOrEqual(&version{Key: key, Main: main, Sub: -1}, func(p *version) bool {
		if p.Key == key {
			prev = p
		}
		return false
	})
	return prev
}

// eventPrev is the PrevKV of an event of key at KV revision rev, whose
// key is cur (nil: absent) just before it: the key as it was before the
// command, as etcd's watch reads prev_kv at the revision before, even
// when the same command wrote or deleted it already.
func (m *Machine) eventPrev(key string, cur *KeyValue, rev int64) *KeyValue {
	if m.usesKVRevision() && (cur == nil || cur.ModRevision >= rev) {
		if v := m.lastBefore(key, rev); v != nil && v.KV != nil {
			p := *v.KV
			return &p
		}
		return nil
	}
	if cur == nil {
		return nil
	}
	p := *cur
	return &p
}

// Compact is etcd's Compact: the versions older than Revision are
// dropped, but for each key the last one at or before it, unless that is
// a deletion, so that a range at Revision still answers.
type Compact struct {
	Revision int64 `json:"revision"`
}

func (m *Machine) compact(c Compact) Result {
	if !m.usesKVRevision() {
		return Result{Err: fmt.Errorf("%w: compaction needs cluster version 5", ErrNotSupported)}
	}
	if c.Revision <= m.compactRevision {
		return Result{Err: fmt.Errorf("%w: %d (compacted at %d)", ErrCompacted, c.Revision, m.compactRevision)}
	}
	if c.Revision > m.kvRevision {
		return Result{Err: fmt.Errorf("%w: %d (current %d)", ErrFutureRevision, c.Revision, m.kvRevision)}
	}
	h := m.history.byRev
	cut := sort.Search(len(h), func(i int) bool { return h[i].Main > c.Revision })
	// Of the versions at or before the revision, each key keeps its last
	// one when it is a value: scanning backwards, the first seen is it.
	seen := map[string]bool{}
	var kept []*version
	for i := cut - 1; i >= 0; i-- {
		v := h[i]
		if seen[v.Key] {
			m.history.byKey.Delete(v)
			m.usage.History -= versionCost(v, false)
			continue
		}
		seen[v.Key] = true
		if v.KV == nil {
			m.history.byKey.Delete(v)
			m.usage.History -= versionCost(v, false)
			continue
		}
		kept = append(kept, v)
	}
	slicesReverse(kept)
	rest := make([]*version, 0, len(kept)+len(h)-cut)
	rest = append(append(rest, kept...), h[cut:]...)
	m.history.byRev = rest
	m.compactRevision = c.Revision
	return Result{Revision: m.revision}
}

func slicesReverse(s []*version) {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
}

// HistorySize is the number of key versions kept.
func (m *Machine) HistorySize() int { return len(m.history.byRev) }

// KeyVersion is one kept version of a key, as History lists it: the key
// as written at KV revision Main, place Sub in its command, or its
// deletion (KV nil).
type KeyVersion struct {
	Key  string
	Main int64
	Sub  int64
	KV   *KeyValue // a copy; nil for a deletion
}

// History calls fn with every kept version of every key, in revision
// order, until fn returns false: each version since the compact
// revision, and for each key its last one at or before it, unless that
// was a deletion. It is what etcd's key bucket holds once a compaction
// has run, which etcd's HashKV hashes.
func (m *Machine) History(fn func(KeyVersion) bool) {
	for _, v := range m.history.byRev {
		kv := KeyVersion{Key: v.Key, Main: v.Main, Sub: v.Sub}
		if v.KV != nil {
			c := *v.KV
			kv.KV = &c
		}
		if !fn(kv) {
			return
		}
	}
}

package statemachine

// The machine counts the bytes it holds, so that the server can bound
// them with a quota as etcd bounds its database file
// (--quota-backend-bytes). The count is a model of the heap, not a
// measure of it: every replica that applied the same log counts the same
// bytes, which a measure of the heap (garbage not yet collected, the
// allocator's rounding, another build's struct layout) could never give,
// and the NOSPACE alarm that the count raises goes through the log, so
// it must not depend on which replica looked.
//
// What a record costs is its strings plus a fixed overhead for its
// struct, its slots in the indexes and the allocator's rounding. The
// overheads are round numbers above the structs' sizes on a 64-bit
// build; they are part of the model, and changing one changes no state,
// only when the alarm is raised.
//
//   - A live key costs KeyOverhead + its key + its value.
//   - A version of the history costs VersionOverhead when it is the key
//     as it is now (its KeyValue is the live one, shared), and otherwise
//     VersionOverhead plus what the key cost when it was live; a
//     deletion costs VersionOverhead + its key.
//   - A session costs SessionOverhead + its identity and labels.
//   - A lease record costs LeaseOverhead + its names, labels, preferred
//     holder and last grant, and each holder and waiter GrantOverhead +
//     its holder identity, value and step-down reason.
//
// The count is kept as commands apply (put, delete, compact, open and end
// a session, and every lease a command emitted an event about), and
// counted afresh on Restore and when the keys start keeping history;
// recount checks the one against the other in the tests.

// Overheads of the byte count, beyond a record's strings.
const (
	// KeyOverhead is a live key's: its KeyValue (80 bytes), its slot in
	// the key tree and the session's key index, rounded up.
	KeyOverhead = 128
	// VersionOverhead is a version's: its struct (56 bytes) and its slots
	// in the history's two indexes, rounded up.
	VersionOverhead = 96
	// SessionOverhead is a session's: its struct, its three index maps and
	// its entries in the identity and lease ID maps.
	SessionOverhead = 256
	// LeaseOverhead is a lease record's: its struct (about 200 bytes) and
	// its map entry.
	LeaseOverhead = 256
	// GrantOverhead is a holder's or a waiter's, and the last grant's.
	GrantOverhead = 128
)

// Usage is the bytes the machine holds, by what holds them.
type Usage struct {
	Keys     int64 // live keys
	History  int64 // versions kept for reads and watches in the past
	Sessions int64
	Leases   int64
}

// Total is every byte counted.
func (u Usage) Total() int64 { return u.Keys + u.History + u.Sessions + u.Leases }

// Usage is the bytes the machine holds. It is deterministic: two
// machines that applied the same commands count the same bytes.
func (m *Machine) Usage() Usage { return m.usage }

func keyCost(kv *KeyValue) int64 { return KeyOverhead + int64(len(kv.Key)+len(kv.Value)) }

// versionCost is what a version of the history costs; live says it is
// the key as it is now, whose KeyValue the key tree holds anyway.
func versionCost(v *version, live bool) int64 {
	switch {
	case v.KV == nil:
		return VersionOverhead + int64(len(v.Key))
	case live:
		return VersionOverhead
	}
	return VersionOverhead + keyCost(v.KV)
}

func sessionCost(s *Session) int64 {
	return SessionOverhead + int64(len(s.Identity)) + labelsCost(s.Labels)
}

func labelsCost(l map[string]string) int64 {
	var n int
	for k, v := range l {
		n += len(k) + len(v)
	}
	return int64(n)
}

func leaseCost(l *lease) int64 {
	n := LeaseOverhead + int64(len(l.Namespace)+len(l.Name)+len(l.preferredHolder())) + labelsCost(l.labels())
	for i := range l.holders {
		h := &l.holders[i]
		n += GrantOverhead + int64(len(h.identity)+len(h.value)+len(h.stepDown()))
	}
	for _, w := range l.waiters() {
		n += GrantOverhead + int64(len(w.Holder)+len(w.Value))
	}
	if g := l.last; g != nil {
		n += GrantOverhead + int64(len(g.Holder)+len(g.Ended)+len(g.Reason))
	}
	return n
}

// countLeases brings the count of the leases the command touched up to
// date: every change of a lease emits an event about it.
func (m *Machine) countLeases(touched []LeaseID) {
	for _, id := range touched {
		// A lease deleted (collectLeases) was uncounted there.
		if l, ok := m.leases.get(id); ok {
			now := leaseCost(l)
			m.usage.Leases += now - l.cost
			l.cost = now
		}
	}
}

// recount counts every byte afresh: what the incremental count must
// equal, and how Restore starts it.
func (m *Machine) recount() (Usage, map[LeaseID]int64) {
	var u Usage
	m.keys.Ascend(func(kv *KeyValue) bool {
		u.Keys += keyCost(kv)
		return true
	})
	for _, v := range m.history.byRev {
		live := false
		if v.KV != nil {
			cur, ok := m.keys.Get(&KeyValue{Key: v.Key})
			live = ok && cur == v.KV
		}
		u.History += versionCost(v, live)
	}
	for _, s := range m.sessions {
		u.Sessions += sessionCost(&s.Session)
	}
	costs := make(map[LeaseID]int64, m.leases.len())
	for l := range m.leases.all() {
		costs[l.LeaseID] = leaseCost(l)
		u.Leases += costs[l.LeaseID]
	}
	return u, costs
}

// resetUsage replaces the count with a recount.
func (m *Machine) resetUsage() {
	var costs map[LeaseID]int64
	m.usage, costs = m.recount()
	for l := range m.leases.all() {
		l.cost = costs[l.LeaseID]
	}
}

// CompactionTarget is the oldest KV revision whose compaction brings the
// history's bytes down to at most limit, as near as dropping the oldest
// versions first can tell: each version before it that a compaction
// drops is counted as freed. It is 0 when the history is within limit
// already, and never above the current KV revision. A compaction keeps
// each key's last value at the revision, so the history may stay above
// limit when it is mostly such values; the caller compacts again later.
func (m *Machine) CompactionTarget(limit int64) int64 {
	excess := m.usage.History - limit
	if excess <= 0 || !m.usesKVRevision() {
		return 0
	}
	h := m.history.byRev
	var freed int64
	for i, v := range h {
		// Counted as if dropped whole; a key's last value at the
		// revision stays, which the next compaction finds.
		freed += versionCost(v, false)
		if freed >= excess {
			// Compacting at the next version's revision drops v and
			// everything of its command.
			if i+1 < len(h) {
				return min(h[i+1].Main, m.kvRevision)
			}
			return m.kvRevision
		}
	}
	return m.kvRevision
}

package statemachine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"

	"github.com/google/btree"
)

// A snapshot is JSON before cluster version 6 (BinaryVersion), whose
// "version" field is snapshotVersion, and binary from it on:
// binarySnapshotMagic, then a varint of binarySnapshotFormat, then the
// fields of snapshot in the codec of codec.go. Restore reads both; a
// JSON snapshot begins with '{', which the magic does not.
const snapshotVersion = 1

var binarySnapshotMagic = []byte("\xffTSN")

const binarySnapshotFormat = 2

type snapshot struct {
	Version  int        `json:"version"`
	Revision int64      `json:"revision"`
	Epoch    int64      `json:"epoch"`
	Sessions []Session  `json:"sessions"`
	Leases   []Lease    `json:"leases"`
	Keys     []KeyValue `json:"keys"`
	// Members is newer than version 1's other fields; a snapshot without
	// it reads as no member having advertised an address yet.
	Members map[string]string `json:"members,omitempty"`
	// Versions and ClusterVersion are newer still: absent, every member
	// and the cluster run version 1.
	Versions       map[string]int `json:"versions,omitempty"`
	ClusterVersion int            `json:"cluster_version,omitempty"`
	// From cluster version 5: the keys' clock and their history since
	// the compact revision, oldest first (a nil KV is a deletion), and
	// the members' etcd API addresses.
	KVRevision      int64             `json:"kv_revision,omitempty"`
	CompactRevision int64             `json:"compact_revision,omitempty"`
	History         []keyVersion      `json:"history,omitempty"`
	EtcdAddresses   map[string]string `json:"etcd_addresses,omitempty"`
	// From cluster version 7: the alarms raised. Appended to the binary
	// form only when there is one, so that a snapshot without alarms
	// reads in builds from before them.
	Alarms []AlarmMember `json:"alarms,omitempty"`
	// From cluster version 8: etcd's users and roles, once used. In the
	// binary form they follow the alarms (an empty list then, when none
	// is raised), so that a snapshot without them reads as before.
	Auth *authSnapshot `json:"auth,omitempty"`

	// live, when set, stands for Leases in the binary form: the
	// machine's own records in order, written as they are rather than
	// copied first (Snapshot).
	live []*lease
	// keyTree and versions, when keyTree is set, stand for Keys and
	// History in the binary form: a clone of the machine's key tree and
	// its history's versions as they were, neither of which the machine
	// changes afterwards (SnapshotSplit).
	keyTree  *btree.BTreeG[*KeyValue]
	versions []*version
}

type keyVersion struct {
	Key  string    `json:"key"`
	Main int64     `json:"main"`
	Sub  int64     `json:"sub,omitempty"`
	KV   *KeyValue `json:"kv,omitempty"`

	Expired bool `json:"expired,omitempty"`
}

// Snapshot writes the whole state. Two machines that applied the same
// commands write the same bytes.
//
// The binary form is written from the machine's own lease records,
// without copying them, in pieces of about flushAt bytes as they are
// encoded: a copy of every lease, and the whole encoding beside it, would
// each weigh about as much as the state itself, for as long as the
// snapshot takes. The machine must not change until Snapshot returns.
func (m *Machine) Snapshot(w io.Writer) error {
	rest, err := m.snapshotSplit(w, false)
	if err != nil {
		return err
	}
	return rest()
}

// SnapshotSplit is Snapshot in two steps, so that a machine whose state
// is large need not stop applying while most of it is encoded. The call
// writes what the machine changes in place (sessions, leases), and takes
// what it never changes in place — its key tree, cloned in O(1) as
// copy-on-write, and its versions, which are only ever appended to or
// replaced by a new slice — with the small maps copied; rest writes
// those, and may run while the machine applies commands. The machine
// must not change between SnapshotSplit and its return; rest must run
// once, on one goroutine. The bytes are Snapshot's. Two SnapshotSplits
// must not run at once (the clone changes the tree's copy-on-write
// context); Snapshot beside one may, since it clones nothing.
//
// A snapshot encoded whole under the lock stopped every write for a time
// that grew with the keys and their history: through etcd's client, 64
// goroutines' p99 was 25 ms, and 16.3–16.8 ms with the rest encoded
// beside apply (docs/benchmarks.md).
func (m *Machine) SnapshotSplit(w io.Writer) (rest func() error, err error) {
	return m.snapshotSplit(w, true)
}

// snapshotSplit is SnapshotSplit; without clone, rest reads the
// machine's own key tree, and must run before the machine changes.
func (m *Machine) snapshotSplit(w io.Writer, clone bool) (rest func() error, err error) {
	if !m.atLeast(BinaryVersion) {
		return func() error { return nil }, m.snapshotJSON(w)
	}
	snap := m.snapshotHead()
	snap.live = m.leases.sorted()
	e := &encoder{b: make([]byte, 0, flushAt+flushAt/4), w: w}
	e.b = append(e.b, binarySnapshotMagic...)
	e.uint(binarySnapshotFormat)
	snap.encodeHead(e)
	snap.live = nil
	snap.keyTree, snap.versions = m.keys, m.history.byRev[:len(m.history.byRev):len(m.history.byRev)]
	if clone {
		snap.keyTree = m.keys.Clone()
		snap.Members, snap.Versions, snap.EtcdAddresses = maps.Clone(snap.Members), maps.Clone(snap.Versions), maps.Clone(snap.EtcdAddresses)
	}
	return func() error {
		snap.encodeTail(e)
		e.flush()
		if e.err != nil {
			return fmt.Errorf("write snapshot: %w", e.err)
		}
		return nil
	}, nil
}

// snapshotJSON is Snapshot below BinaryVersion.
func (m *Machine) snapshotJSON(w io.Writer) error {
	snap := m.snapshotState()
	snap.Leases = m.Leases("")
	// No command that is not UTF-8 is applied below BinaryVersion
	// (EncodeJSON refuses it, and raftnode refuses a binary entry):
	// should one be anyway, fail rather than let JSON rewrite it.
	check := encoder{checkUTF8: true}
	snap.encode(&check)
	if check.notUTF8 {
		return fmt.Errorf("write snapshot: %w: the state holds bytes that are not UTF-8 at cluster version %d, and JSON would rewrite them", ErrNotUTF8, m.ClusterVersion())
	}
	if err := json.NewEncoder(w).Encode(&snap); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	return nil
}

// snapshotState is the state to snapshot, but for its leases.
func (m *Machine) snapshotState() snapshot {
	snap := m.snapshotHead()
	for _, v := range m.history.byRev {
		snap.History = append(snap.History, keyVersion{Key: v.Key, Main: v.Main, Sub: v.Sub, KV: v.KV, Expired: v.Expired})
	}
	snap.Keys, _ = m.Range("", 0)
	return snap
}

// snapshotHead is the state but for its leases, keys and history.
func (m *Machine) snapshotHead() snapshot {
	snap := snapshot{
		Version:  snapshotVersion,
		Revision: m.revision,
		Epoch:    m.epoch,
		Sessions: m.Sessions(),
		Members:  m.members,

		Versions:       m.versions,
		ClusterVersion: m.version,

		KVRevision:      m.kvRevision,
		CompactRevision: m.compactRevision,
		EtcdAddresses:   m.etcdAddrs,
		Alarms:          m.Alarms(),
		Auth:            m.auth.snapshot(),
	}
	if len(snap.Alarms) == 0 {
		snap.Alarms = nil
	}
	return snap
}

// readSnapshot reads a snapshot in either form.
func readSnapshot(r io.Reader) (snapshot, error) {
	var snap snapshot
	data, err := io.ReadAll(r)
	if err != nil {
		return snap, fmt.Errorf("read snapshot: %w", err)
	}
	if !bytes.HasPrefix(data, binarySnapshotMagic) {
		if err := json.Unmarshal(data, &snap); err != nil {
			return snap, fmt.Errorf("read snapshot: %w", err)
		}
		if snap.Version != snapshotVersion {
			return snap, fmt.Errorf("read snapshot: version %d, this build reads version %d", snap.Version, snapshotVersion)
		}
		return snap, nil
	}
	d := decoder{b: data[len(binarySnapshotMagic):]}
	if f := d.uint(); d.err == nil && f != binarySnapshotFormat {
		return snap, fmt.Errorf("read snapshot: binary format %d, this build reads format %d", f, binarySnapshotFormat)
	}
	snap.decode(&d)
	if err := d.done("state"); err != nil {
		return snapshot{}, fmt.Errorf("read snapshot: %w", err)
	}
	return snap, nil
}

func (s *snapshot) encode(e *encoder) {
	s.encodeHead(e)
	s.encodeTail(e)
}

// encodeHead encodes the state up to its leases; encodeTail the rest.
func (s *snapshot) encodeHead(e *encoder) {
	e.int(s.Revision)
	e.int(s.Epoch)
	encodeSlice(e, s.Sessions, func(e *encoder, s *Session) {
		e.int(s.ID)
		e.str(s.Identity)
		e.int(s.TTL)
		e.labels(s.Labels)
		e.int(s.OpenTime)
		e.int(s.LeaseID)
	})
	if s.live != nil {
		e.uint(uint64(len(s.live)))
		for _, l := range s.live {
			encodeLease(e, l)
			if len(e.b) >= flushAt {
				e.flush()
			}
		}
	} else {
		e.uint(uint64(len(s.Leases)))
		for i := range s.Leases {
			encodeLease(e, recordOf(&s.Leases[i]))
		}
	}
}

func (s *snapshot) encodeTail(e *encoder) {
	if s.keyTree != nil {
		e.uint(uint64(s.keyTree.Len()))
		s.keyTree.Ascend(func(kv *KeyValue) bool {
			encodeKeyValue(e, kv)
			if len(e.b) >= flushAt {
				e.flush()
			}
			return true
		})
	} else {
		encodeSlice(e, s.Keys, encodeKeyValue)
	}
	e.labels(s.Members)
	e.intMap(s.Versions)
	e.int(int64(s.ClusterVersion))
	e.int(s.KVRevision)
	e.int(s.CompactRevision)
	encodeVersion := func(e *encoder, key string, main, sub int64, kv *KeyValue, expired bool) {
		e.str(key)
		e.int(main)
		e.int(sub)
		e.bool(kv != nil)
		if kv != nil {
			encodeKeyValue(e, kv)
		}
		e.bool(expired)
	}
	if s.keyTree != nil {
		encodeSlice(e, s.versions, func(e *encoder, v **version) {
			encodeVersion(e, (*v).Key, (*v).Main, (*v).Sub, (*v).KV, (*v).Expired)
		})
	} else {
		encodeSlice(e, s.History, func(e *encoder, v *keyVersion) {
			encodeVersion(e, v.Key, v.Main, v.Sub, v.KV, v.Expired)
		})
	}
	e.labels(s.EtcdAddresses)
	if len(s.Alarms) > 0 || s.Auth != nil {
		encodeSlice(e, s.Alarms, func(e *encoder, a *AlarmMember) {
			e.str(a.Member)
			e.uint(uint64(a.Alarm))
		})
	}
	if s.Auth != nil {
		s.Auth.encode(e)
	}
}

func (s *snapshot) decode(d *decoder) {
	s.Version = snapshotVersion
	s.Revision, s.Epoch = d.int(), d.int()
	s.Sessions = decodeSlice(d, func(d *decoder, s *Session) {
		*s = Session{ID: d.int(), Identity: d.str(), TTL: d.int(), Labels: d.labels(), OpenTime: d.int(), LeaseID: d.int()}
	})
	s.Leases = decodeSlice(d, decodeLease)
	s.Keys = decodeSlice(d, decodeKeyValue)
	s.Members = d.labels()
	s.Versions = d.intMap()
	s.ClusterVersion = d.goInt()
	s.KVRevision, s.CompactRevision = d.int(), d.int()
	s.History = decodeSlice(d, func(d *decoder, v *keyVersion) {
		*v = keyVersion{Key: d.str(), Main: d.int(), Sub: d.int()}
		if d.bool() {
			v.KV = &KeyValue{}
			decodeKeyValue(d, v.KV)
		}
		v.Expired = d.bool()
	})
	s.EtcdAddresses = d.labels()
	// An encoder writes an empty list of alarms only before the auth
	// store: a zero with nothing after it is left for done to refuse as
	// a byte after the state.
	if d.more() && (d.b[0] != 0 || len(d.b) > 1) {
		s.Alarms = decodeSlice(d, func(d *decoder, a *AlarmMember) {
			*a = AlarmMember{Member: d.str(), Alarm: AlarmType(d.small())}
		})
		if len(s.Alarms) == 0 || d.more() {
			s.Auth = &authSnapshot{}
			s.Auth.decode(d)
		}
	}
}

func encodeKeyValue(e *encoder, kv *KeyValue) {
	e.str(kv.Key)
	e.str(kv.Value)
	e.int(kv.CreateRevision)
	e.int(kv.ModRevision)
	e.int(kv.Version)
	e.int(kv.TTL)
	e.int(kv.SessionID)
	e.int(kv.LeaseID)
}

func decodeKeyValue(d *decoder, kv *KeyValue) {
	*kv = KeyValue{
		Key: d.str(), Value: d.str(), CreateRevision: d.int(), ModRevision: d.int(),
		Version: d.int(), TTL: d.int(), SessionID: d.int(), LeaseID: d.int(),
	}
}

func encodeLease(e *encoder, l *lease) {
	e.leaseID(l.LeaseID)
	e.int(int64(l.capacity))
	encodeSlice(e, l.holders, func(e *encoder, h *holder) {
		e.int(h.sessionID)
		e.str(h.identity)
		e.int(h.token)
		e.int(h.acquireTime)
		e.int(h.renewTime)
		e.str(h.value)
		e.bool(h.exclusive())
		e.str(h.stepDown())
		e.int(h.maxHold())
	})
	encodeSlice(e, l.waiters(), func(e *encoder, w *Waiter) {
		e.int(w.SessionID)
		e.str(w.Holder)
		e.int(w.Since)
		e.str(w.Value)
		e.bool(w.Exclusive)
		e.int(w.MaxHold)
	})
	e.int(l.transitions)
	e.labels(l.labels())
	e.int(l.lockDelay())
	e.int(l.delayRevision())
	e.int(l.createRev)
	e.int(l.modRev)
	e.bool(l.last != nil)
	if g := l.last; g != nil {
		e.int(g.SessionID)
		e.str(g.Holder)
		e.int(g.Token)
		e.int(g.AcquireTime)
		e.int(g.RenewTime)
		e.int(g.EndTime)
		e.str(string(g.Ended))
		e.str(g.Reason)
	}
	e.int(l.gcAfter)
	e.int(l.idleSince)
	e.str(l.preferredHolder())
}

func decodeLease(d *decoder, l *Lease) {
	*l = Lease{LeaseID: d.leaseID(), Capacity: d.goInt()}
	l.Holders = decodeSlice(d, func(d *decoder, g *Grant) {
		*g = Grant{
			SessionID: d.int(), Holder: d.str(), Token: d.int(), AcquireTime: d.int(), RenewTime: d.int(),
			Value: d.str(), Exclusive: d.bool(), StepDown: d.str(), MaxHold: d.int(),
		}
	})
	l.Waiters = decodeSlice(d, func(d *decoder, w *Waiter) {
		*w = Waiter{SessionID: d.int(), Holder: d.str(), Since: d.int(), Value: d.str(), Exclusive: d.bool(), MaxHold: d.int()}
	})
	l.Transitions = d.int()
	l.Labels = d.labels()
	l.LockDelay, l.DelayRevision = d.int(), d.int()
	l.CreateRevision, l.ModRevision = d.int(), d.int()
	if d.bool() {
		l.Last = &EndedGrant{
			SessionID: d.int(), Holder: d.str(), Token: d.int(), AcquireTime: d.int(),
			RenewTime: d.int(), EndTime: d.int(), Ended: Ending(d.str()), Reason: d.str(),
		}
	}
	l.GCAfter, l.IdleSince = d.int(), d.int()
	l.PreferredHolder = d.str()
}

// Restore replaces the state with a snapshot and rebuilds the indexes.
// On error the machine is unchanged.
func (m *Machine) Restore(r io.Reader) error {
	snap, err := readSnapshot(r)
	if err != nil {
		return err
	}
	next := New()
	next.revision, next.epoch = snap.Revision, snap.Epoch
	for id, addr := range snap.Members {
		next.members[id] = addr
	}
	for id, v := range snap.Versions {
		next.versions[id] = v
	}
	next.version = snap.ClusterVersion
	next.kvRevision, next.compactRevision = snap.KVRevision, snap.CompactRevision
	for id, addr := range snap.EtcdAddresses {
		next.etcdAddrs[id] = addr
	}
	for _, s := range snap.Sessions {
		next.sessions[s.ID] = newSessionState(s)
		next.identities[s.Identity]++
	}
	session := func(id int64, what string) (*sessionState, error) {
		s, ok := next.sessions[id]
		if !ok {
			return nil, fmt.Errorf("read snapshot: %s names session %d, which is not in it", what, id)
		}
		return s, nil
	}
	for i := range snap.Leases {
		l := recordOf(&snap.Leases[i])
		next.leases.put(l)
		for _, h := range l.holders {
			s, err := session(h.sessionID, "a grant of "+l.LeaseID.String())
			if err != nil {
				return err
			}
			s.hold(l)
		}
		for _, w := range l.waiters() {
			s, err := session(w.SessionID, "a waiter of "+l.LeaseID.String())
			if err != nil {
				return err
			}
			s.wait(l.LeaseID)
		}
	}
	for i := range snap.Keys {
		kv := &snap.Keys[i]
		if kv.SessionID != 0 {
			s, err := session(kv.SessionID, "key "+kv.Key)
			if err != nil {
				return err
			}
			s.bind(kv.Key)
		}
		next.keys.ReplaceOrInsert(kv)
	}
	for _, s := range snap.Sessions {
		if s.LeaseID != 0 {
			next.leaseIDs[s.LeaseID] = s.ID
		}
	}
	// A version that is the key as it is shares its KeyValue with the
	// key tree, as it did before the snapshot.
	for _, sv := range snap.History {
		v := &version{Key: sv.Key, Main: sv.Main, Sub: sv.Sub, KV: sv.KV, Expired: sv.Expired}
		if cur, ok := next.keys.Get(&KeyValue{Key: sv.Key}); ok && sv.KV != nil && *cur == *sv.KV {
			v.KV = cur
		}
		next.recordVersion(v)
	}
	for _, a := range snap.Alarms {
		next.alarms[a] = struct{}{}
	}
	next.auth = snap.Auth.restore()
	next.resetUsage()
	*m = *next
	return nil
}

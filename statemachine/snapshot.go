package statemachine

import (
	"encoding/json"
	"fmt"
	"io"
)

// snapshotVersion is written first so that a future format can be told
// apart instead of misread.
const snapshotVersion = 1

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
func (m *Machine) Snapshot(w io.Writer) error {
	snap := snapshot{
		Version:  snapshotVersion,
		Revision: m.revision,
		Epoch:    m.epoch,
		Sessions: m.Sessions(),
		Leases:   m.Leases(""),
		Members:  m.members,

		Versions:       m.versions,
		ClusterVersion: m.version,

		KVRevision:      m.kvRevision,
		CompactRevision: m.compactRevision,
		EtcdAddresses:   m.etcdAddrs,
	}
	for _, v := range m.history.byRev {
		snap.History = append(snap.History, keyVersion{Key: v.Key, Main: v.Main, Sub: v.Sub, KV: v.KV, Expired: v.Expired})
	}
	snap.Keys, _ = m.Range("", 0)
	if err := json.NewEncoder(w).Encode(&snap); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	return nil
}

// Restore replaces the state with a snapshot and rebuilds the indexes.
// On error the machine is unchanged.
func (m *Machine) Restore(r io.Reader) error {
	var snap snapshot
	if err := json.NewDecoder(r).Decode(&snap); err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	if snap.Version != snapshotVersion {
		return fmt.Errorf("read snapshot: version %d, this build reads version %d", snap.Version, snapshotVersion)
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
		l := &snap.Leases[i]
		next.leases[l.LeaseID] = l
		for _, g := range l.Holders {
			s, err := session(g.SessionID, "a grant of "+l.LeaseID.String())
			if err != nil {
				return err
			}
			s.held[l.LeaseID] = struct{}{}
		}
		for _, w := range l.Waiters {
			s, err := session(w.SessionID, "a waiter of "+l.LeaseID.String())
			if err != nil {
				return err
			}
			s.waiting[l.LeaseID] = struct{}{}
		}
	}
	for i := range snap.Keys {
		kv := &snap.Keys[i]
		if kv.SessionID != 0 {
			s, err := session(kv.SessionID, "key "+kv.Key)
			if err != nil {
				return err
			}
			s.keys[kv.Key] = struct{}{}
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
	*m = *next
	return nil
}

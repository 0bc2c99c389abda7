package statemachine

import (
	"fmt"
	"maps"
	"slices"

	"github.com/google/btree"
)

// Machine is the whole replicated state. It is not safe for concurrent
// use: the replication layer applies commands one at a time and guards
// reads with a lock.
type Machine struct {
	revision   int64
	epoch      int64
	sessions   map[int64]*sessionState
	identities map[string]int // open sessions per identity
	leases     map[LeaseID]*Lease
	keys       *btree.BTreeG[*KeyValue]
	members    map[string]string // raft server ID → advertised API address

	// now and events belong to the command being applied.
	now    int64
	events []Event
}

// New returns an empty machine at revision 0.
func New() *Machine {
	return &Machine{
		sessions:   map[int64]*sessionState{},
		identities: map[string]int{},
		leases:     map[LeaseID]*Lease{},
		keys:       btree.NewG(32, keyLess),
		members:    map[string]string{},
	}
}

// Revision is the revision of the last event.
func (m *Machine) Revision() int64 { return m.revision }

// Epoch is the current leadership epoch.
func (m *Machine) Epoch() int64 { return m.epoch }

// Apply runs one command at the leader-stamped time now (unix ns). A
// command that fails returns Result.Err, changes nothing and emits no
// events.
func (m *Machine) Apply(now int64, cmd Command) Result {
	m.now = now
	m.events = nil
	var res Result
	switch c := cmd.(type) {
	case OpenSession:
		res = m.openSession(c)
	case CloseSession:
		res = m.closeSession(c)
	case ExpireSessions:
		res = m.expireSessions(c)
	case Acquire:
		res = m.acquire(c)
	case Release:
		res = m.release(c)
	case SetValue:
		res = m.setValue(c)
	case Revoke:
		res = m.revoke(c)
	case CancelWait:
		res = m.cancelWait(c)
	case Put:
		res = m.put(c)
	case Delete:
		res = m.delete(c)
	case CompareAndSwap:
		res = m.compareAndSwap(c)
	case ExpireKeys:
		res = m.expireKeys(c)
	case EndLockDelays:
		res = m.endLockDelays(c)
	case NewEpoch:
		m.epoch++
		res.Epoch = m.epoch
	case SetMember:
		res = m.setMember(c)
	default:
		res.Err = fmt.Errorf("%w: %T", ErrUnknownCommand, cmd)
	}
	if res.Err != nil {
		// Every command checks before it changes anything; an event here
		// would mean a half-applied command.
		if len(m.events) > 0 {
			panic(fmt.Sprintf("statemachine: %T failed after emitting events: %v", cmd, res.Err))
		}
	}
	res.Events = m.events
	res.Revision = m.revision
	m.events = nil
	return res
}

// emit advances the revision and records an event at it.
func (m *Machine) emit(e Event) int64 {
	m.revision++
	e.Revision = m.revision
	e.Time = m.now
	m.events = append(m.events, e)
	return m.revision
}

func (m *Machine) setMember(c SetMember) Result {
	// The server checks that ID is set; an entry without one changes
	// nothing on any replica.
	switch {
	case c.ID == "":
	case c.APIAddress == "":
		delete(m.members, c.ID)
	default:
		m.members[c.ID] = c.APIAddress
	}
	return Result{}
}

// MemberAddress is the API address member id advertised, if it did.
func (m *Machine) MemberAddress(id string) (string, bool) {
	a, ok := m.members[id]
	return a, ok
}

// Members maps every member that advertised an API address to it; the
// caller owns the copy.
func (m *Machine) Members() map[string]string { return maps.Clone(m.members) }

// Deadlines lists what a new leader's lessor must time.
func (m *Machine) Deadlines() Deadlines {
	var d Deadlines
	for _, id := range slices.Sorted(maps.Keys(m.sessions)) {
		d.Sessions = append(d.Sessions, SessionTTL{ID: id, TTL: m.sessions[id].TTL})
	}
	m.keys.Ascend(func(kv *KeyValue) bool {
		if kv.TTL > 0 {
			d.Keys = append(d.Keys, KeyTTL{Key: kv.Key, ModRevision: kv.ModRevision, TTL: kv.TTL})
		}
		return true
	})
	for _, l := range m.Leases("") {
		if l.DelayRevision != 0 {
			d.Delays = append(d.Delays, LockDelay{Lease: l.LeaseID, Revision: l.DelayRevision, Delay: l.LockDelay})
		}
	}
	return d
}

func cloneLabels(l map[string]string) map[string]string {
	if len(l) == 0 {
		return nil
	}
	return maps.Clone(l)
}

package statemachine

import (
	"fmt"
	"maps"
	"slices"

	"github.com/google/btree"
)

// Version is the cluster version this build runs. Every replica must
// apply every command alike, so behaviour that an older build would apply
// differently is switched on only once the cluster version reaches it:
//
//   - 1: the first version.
//   - 2: lease garbage collection (CollectLeases), preferred holders
//     (SetPreferred, and the grant order and step-down requests they
//     bring), and a waiter that leaves the head of a queue lets the next
//     one in at once.
//   - 3: max hold (AskStepDown).
//   - 4: commands that act on a session or a grant are refused when
//     their Actor may not act for its identity (ErrNotOwner).
//   - 5: keys take KV revisions and keep their history (mvcc.go); Txn,
//     Compact, and sessions opened with an etcd lease ID.
//   - 6: the log and snapshots are binary (codec.go, BinaryVersion), so
//     keys and values keep every byte; before it a key or value that is
//     not UTF-8 is refused.
//   - 7: alarms (SetAlarm, alarm.go): while a NOSPACE alarm is raised,
//     commands that add data are refused (ErrNoSpace).
//   - 8: etcd's users and roles (AuthChange, authstore.go).
const Version = 8

// Machine is the whole replicated state. It is not safe for concurrent
// use: the replication layer applies commands one at a time and guards
// reads with a lock.
type Machine struct {
	revision   int64
	epoch      int64
	sessions   map[int64]*sessionState
	identities map[string]int // open sessions per identity
	leases     leaseIndex
	keys       *btree.BTreeG[*KeyValue]
	members    map[string]string // node ID → advertised API address
	versions   map[string]int    // node ID → the version its build runs
	version    int               // the cluster version; 0 means 1

	// kvRevision, compactRevision and history are the keys' own clock
	// and their versions since compaction (mvcc.go). leaseIDs maps the
	// etcd lease IDs chosen by clients to the sessions that took them.
	kvRevision      int64
	compactRevision int64
	history         history
	leaseIDs        map[int64]int64
	etcdAddrs       map[string]string // node ID → advertised etcd API address

	// usage is the bytes held (usage.go; each lease keeps its share of
	// usage.Leases in Lease.cost); alarms are the alarms raised (alarm.go).
	usage  Usage
	alarms map[AlarmMember]struct{}
	// auth is etcd's users and roles (authstore.go).
	auth authStore

	// now, events and touched belong to the command being applied.
	now     int64
	events  []Event
	touched []LeaseID // leases the command emitted events about
	// kvChanges counts the command's key changes: the first moves the
	// KV revision, and each is a sub-revision of it.
	kvChanges int64
}

// New returns an empty machine at revision 0.
func New() *Machine {
	return &Machine{
		sessions:   map[int64]*sessionState{},
		identities: map[string]int{},
		leases:     newLeaseIndex(),
		keys:       btree.NewG(32, keyLess),
		members:    map[string]string{},
		versions:   map[string]int{},
		history:    newHistory(),
		leaseIDs:   map[int64]int64{},
		etcdAddrs:  map[string]string{},
		alarms:     map[AlarmMember]struct{}{},
		auth:       newAuthStore(),
	}
}

// ClusterVersion is the version every replica applies commands at.
func (m *Machine) ClusterVersion() int { return max(m.version, 1) }

func (m *Machine) atLeast(v int) bool { return m.ClusterVersion() >= v }

// Revision is the revision of the last event.
func (m *Machine) Revision() int64 { return m.revision }

// Epoch is the current leadership epoch.
func (m *Machine) Epoch() int64 { return m.epoch }

// Apply runs one command at the leader-stamped time now (unix ns). A
// command that fails returns Result.Err, changes nothing and emits no
// events.
func (m *Machine) Apply(now int64, cmd Command) Result {
	m.now = now
	m.events, m.touched = nil, m.touched[:0]
	m.kvChanges = 0
	var res Result
	if err := m.checkSpace(cmd); err != nil {
		return Result{Err: err, Revision: m.revision, KVRevision: m.kvRevision}
	}
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
	case CollectLeases:
		res = m.collectLeases(c)
	case SetPreferred:
		res = m.setPreferred(c)
	case AskStepDown:
		res = m.askStepDownCmd(c)
	case SetVersion:
		if c.Version > m.ClusterVersion() && c.Version <= Version {
			from := m.ClusterVersion()
			m.version = c.Version
			if from < 5 && c.Version >= 5 {
				m.startKVRevision()
				m.resetUsage()
			}
		}
	case Txn:
		res = m.txn(c)
	case Compact:
		res = m.compact(c)
	case SetAlarm:
		res = m.setAlarm(c)
	case AuthChange:
		res = m.authChange(c)
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
	m.settleIdle()
	res.Events = m.events
	res.Revision = m.revision
	res.KVRevision = m.kvRevision
	m.events = nil
	return res
}

// settleIdle dates the idleness of the leases the command touched. A
// lease left idle and collectable gets IdleSince = now, and its last
// event of the command carries GCAfter, which is how the leader's lessor
// learns to time it; a lease left busy loses its IdleSince. Any change to
// an idle lease restarts its idle time, so the lessor's deadline and the
// logged one agree.
func (m *Machine) settleIdle() {
	// A mass expiry touches thousands: sort rather than compare each pair.
	slices.SortFunc(m.touched, compareLeaseID)
	m.touched = slices.Compact(m.touched)
	m.countLeases(m.touched)
	for _, id := range m.touched {
		l, ok := m.leases.get(id)
		if !ok {
			continue
		}
		if !l.Idle() || l.gcAfter <= 0 {
			l.idleSince = 0
			continue
		}
		l.idleSince = m.now
		for j := len(m.events) - 1; j >= 0; j-- {
			if e := &m.events[j]; e.Type.IsLease() && e.Lease == id {
				e.GCAfter = l.gcAfter
				break
			}
		}
	}
}

// emit advances the revision and records an event at it.
func (m *Machine) emit(e Event) int64 {
	m.revision++
	e.Revision = m.revision
	e.Time = m.now
	m.events = append(m.events, e)
	if e.Type.IsLease() {
		m.touched = append(m.touched, e.Lease)
	}
	return m.revision
}

func (m *Machine) setMember(c SetMember) Result {
	// The server checks that ID is set; an entry without one changes
	// nothing on any replica.
	switch {
	case c.ID == "":
	case c.APIAddress == "":
		delete(m.members, c.ID)
		delete(m.versions, c.ID)
		delete(m.etcdAddrs, c.ID)
	default:
		m.members[c.ID] = c.APIAddress
		if c.EtcdAddress != "" {
			m.etcdAddrs[c.ID] = c.EtcdAddress
		} else {
			delete(m.etcdAddrs, c.ID)
		}
		if c.Version > 0 {
			m.versions[c.ID] = c.Version
		} else {
			delete(m.versions, c.ID) // an older build again
		}
	}
	return Result{}
}

// MemberVersion is the version member id's build runs, as it registered
// it: 1 for a build from before versions, 0 for no registration.
func (m *Machine) MemberVersion(id string) int {
	if _, ok := m.members[id]; !ok {
		return 0
	}
	return max(m.versions[id], 1)
}

// MemberAddress is the API address member id advertised, if it did.
func (m *Machine) MemberAddress(id string) (string, bool) {
	a, ok := m.members[id]
	return a, ok
}

// MemberEtcdAddress is the etcd API address member id advertised, if it
// serves one.
func (m *Machine) MemberEtcdAddress(id string) (string, bool) {
	a, ok := m.etcdAddrs[id]
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
	for _, l := range m.leases.sorted() {
		if l.delayRevision() != 0 {
			d.Delays = append(d.Delays, LockDelay{Lease: l.LeaseID, Revision: l.delayRevision(), Delay: l.lockDelay()})
		}
		if l.idleSince != 0 {
			d.Idle = append(d.Idle, IdleLease{Lease: l.LeaseID, Revision: l.modRev, GCAfter: l.gcAfter, IdleSince: l.idleSince})
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

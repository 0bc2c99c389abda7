package statemachine

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Alarms are etcd's: a member raises one through the log, so that every
// replica refuses the same commands from the same entry on, whichever
// member looked, and the alarm outlives restarts and snapshots. A NOSPACE
// alarm is raised by the server of a member that holds more bytes than
// its quota; while any member's is raised, every command that adds data
// is refused with ErrNoSpace, and what frees data or lets go of something
// (deletes, compaction, releases, closing or expiring sessions, revokes,
// cancelled waits) goes on, as etcd's capped applier allows deletes,
// lease revokes and compaction. Keep-alives never enter the log, so no
// alarm can refuse one. An operator clears the alarm (etcd's Alarm
// DEACTIVATE, `etcdctl alarm disarm`); if the member is still over its
// quota, its server raises it again.

// ErrNoSpace is returned, while a NOSPACE alarm is raised, for a command
// that would add data. Its text is etcd's, less the "etcdserver: " of
// etcd's wire error, which the etcd API adds.
var ErrNoSpace = errors.New("mvcc: database space exceeded")

// AlarmType says what an alarm warns of. Numbered as etcd's AlarmType.
type AlarmType uint8

// AlarmNoSpace is etcd's NOSPACE: a member holds more than its quota.
const AlarmNoSpace AlarmType = 1

func (a AlarmType) String() string {
	if a == AlarmNoSpace {
		return "NOSPACE"
	}
	return fmt.Sprintf("alarm %d", uint8(a))
}

// AlarmMember is an alarm raised by a member (its node ID).
type AlarmMember struct {
	Member string    `json:"member"`
	Alarm  AlarmType `json:"alarm"`
}

// SetAlarm raises (Active) or clears an alarm of a member. It emits no
// event and leaves the revision alone; raising an alarm that is raised,
// or clearing one that is not, changes nothing.
type SetAlarm struct {
	Member string    `json:"member"`
	Alarm  AlarmType `json:"alarm"`
	Active bool      `json:"active,omitempty"`
}

// alarmVersion is the cluster version that runs alarms.
const alarmVersion = 7

func (m *Machine) setAlarm(c SetAlarm) Result {
	switch {
	case !m.atLeast(alarmVersion):
		return Result{Err: fmt.Errorf("%w: alarms need cluster version %d", ErrNotSupported, alarmVersion)}
	case c.Alarm != AlarmNoSpace:
		return Result{Err: fmt.Errorf("%w: %v", ErrNotSupported, c.Alarm)}
	case c.Member == "":
		return Result{Err: fmt.Errorf("%w: an alarm names no member", ErrNotSupported)}
	}
	a := AlarmMember{Member: c.Member, Alarm: c.Alarm}
	if c.Active {
		m.alarms[a] = struct{}{}
	} else {
		delete(m.alarms, a)
	}
	return Result{}
}

// Alarms lists the alarms raised, by member then type; the caller owns
// the copy.
func (m *Machine) Alarms() []AlarmMember {
	return slices.SortedFunc(maps.Keys(m.alarms), compareAlarm)
}

func compareAlarm(a, b AlarmMember) int {
	return cmp.Or(cmp.Compare(a.Member, b.Member), cmp.Compare(a.Alarm, b.Alarm))
}

// NoSpace reports whether a NOSPACE alarm is raised: the machine refuses
// commands that add data.
func (m *Machine) NoSpace() bool {
	for a := range m.alarms {
		if a.Alarm == AlarmNoSpace {
			return true
		}
	}
	return false
}

// checkSpace refuses, while a NOSPACE alarm is raised, a command that
// would add data.
func (m *Machine) checkSpace(cmd Command) error {
	if len(m.alarms) == 0 || !AddsData(cmd) || !m.NoSpace() {
		return nil
	}
	names := make([]string, 0, len(m.alarms))
	for _, a := range m.Alarms() {
		names = append(names, a.Member)
	}
	return fmt.Errorf("%w: NOSPACE alarm raised by %v", ErrNoSpace, names)
}

// AddsData reports whether cmd is one a NOSPACE alarm refuses: it may
// hold more bytes after it than before. Those are etcd's Put, a Txn with
// a Put (nested ones too) and LeaseGrant, and the native API's sessions,
// acquires, grant values and key writes. Everything else frees, ends or
// only moves something, and holders must always be able to let go.
func AddsData(cmd Command) bool {
	switch c := cmd.(type) {
	case OpenSession, Acquire, SetValue, Put:
		return true
	case CompareAndSwap:
		return !c.Delete
	case Txn:
		return c.puts()
	}
	return false
}

// puts reports whether any branch of t, nested ones included, puts.
func (t *Txn) puts() bool {
	for _, ops := range [][]TxnOp{t.Success, t.Failure} {
		for _, op := range ops {
			if op.Type == OpPut || op.Type == OpTxn && op.Txn != nil && op.Txn.puts() {
				return true
			}
		}
	}
	return false
}

package statemachine

import "io"

// Machine is the whole replicated state. It is not safe for concurrent
// use: the replication layer applies commands one at a time and guards
// reads with a lock.
type Machine struct {
	revision int64
	epoch    int64
}

// New returns an empty machine at revision 0.
func New() *Machine { return &Machine{} }

// Apply runs one command at the leader-stamped time now (unix ns).
func (m *Machine) Apply(now int64, cmd Command) Result { panic("TODO") }

// Revision is the revision of the last event.
func (m *Machine) Revision() int64 { return m.revision }

// Epoch is the current leadership epoch.
func (m *Machine) Epoch() int64 { return m.epoch }

func (m *Machine) Session(id int64) (Session, bool)                  { panic("TODO") }
func (m *Machine) Sessions() []Session                               { panic("TODO") }
func (m *Machine) Lease(id LeaseID) (Lease, bool)                    { panic("TODO") }
func (m *Machine) Leases(namespace string) []Lease                   { panic("TODO") }
func (m *Machine) Key(key string) (KeyValue, bool)                   { panic("TODO") }
func (m *Machine) Range(prefix string, limit int) ([]KeyValue, bool) { panic("TODO") }
func (m *Machine) Deadlines() Deadlines                              { panic("TODO") }
func (m *Machine) Snapshot(w io.Writer) error                        { panic("TODO") }
func (m *Machine) Restore(r io.Reader) error                         { panic("TODO") }

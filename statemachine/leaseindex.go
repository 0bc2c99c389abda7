package statemachine

import (
	"iter"
	"slices"
)

// leaseIndex holds the machine's lease records by namespace, then by
// name. One map keyed by LeaseID spent a 32-byte key per lease, beside
// the same two string headers in the record; keyed by name within its
// namespace, a lease's slot is 24 bytes, and the record's namespace
// shares the one string the index keeps per namespace, where each
// Acquire decoded a copy of its own. A namespace's entry goes when its
// last lease does. Iteration is in no order, as a map's.
type leaseIndex struct {
	byNS map[string]*namespaceLeases
	n    int
}

type namespaceLeases struct {
	name   string
	byName map[string]*lease
}

func newLeaseIndex() leaseIndex { return leaseIndex{byNS: map[string]*namespaceLeases{}} }

func (x *leaseIndex) get(id LeaseID) (*lease, bool) {
	ns, ok := x.byNS[id.Namespace]
	if !ok {
		return nil, false
	}
	l, ok := ns.byName[id.Name]
	return l, ok
}

// put adds l, whose ID the index does not hold yet, and points its
// namespace at the index's own string for it.
func (x *leaseIndex) put(l *lease) {
	ns, ok := x.byNS[l.Namespace]
	if !ok {
		ns = &namespaceLeases{name: l.Namespace, byName: map[string]*lease{}}
		x.byNS[l.Namespace] = ns
	}
	l.Namespace = ns.name
	if _, held := ns.byName[l.Name]; !held {
		x.n++
	}
	ns.byName[l.Name] = l
}

func (x *leaseIndex) delete(id LeaseID) {
	ns, ok := x.byNS[id.Namespace]
	if !ok {
		return
	}
	if _, held := ns.byName[id.Name]; held {
		delete(ns.byName, id.Name)
		x.n--
	}
	if len(ns.byName) == 0 {
		delete(x.byNS, id.Namespace)
	}
}

func (x *leaseIndex) len() int { return x.n }

// in yields the lease records of namespace ("" for all), in no order.
func (x *leaseIndex) in(namespace string) iter.Seq[*lease] {
	if namespace == "" {
		return x.all()
	}
	return func(yield func(*lease) bool) {
		if ns, ok := x.byNS[namespace]; ok {
			for _, l := range ns.byName {
				if !yield(l) {
					return
				}
			}
		}
	}
}

// all yields every lease record, in no order.
func (x *leaseIndex) all() iter.Seq[*lease] {
	return func(yield func(*lease) bool) {
		for _, ns := range x.byNS {
			for _, l := range ns.byName {
				if !yield(l) {
					return
				}
			}
		}
	}
}

// sorted is every lease record, by namespace and name.
func (x *leaseIndex) sorted() []*lease {
	out := make([]*lease, 0, x.n)
	for l := range x.all() {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b *lease) int { return compareLeaseID(a.LeaseID, b.LeaseID) })
	return out
}

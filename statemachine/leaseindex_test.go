package statemachine

import (
	"strings"
	"testing"
	"unsafe"
)

func TestTheLeaseIndexSharesANamespaceAndForgetsAnEmptyOne(t *testing.T) {
	x := newLeaseIndex()
	a := &lease{LeaseID: LeaseID{Namespace: strings.Clone("ns"), Name: "a"}}
	b := &lease{LeaseID: LeaseID{Namespace: strings.Clone("ns"), Name: "b"}}
	x.put(a)
	x.put(b)
	expect(t, "leases", x.len(), 2)
	if unsafe.StringData(a.Namespace) != unsafe.StringData(b.Namespace) {
		t.Fatalf("namespace of two leases in it: got = two strings, expected: one shared")
	}
	if got, ok := x.get(LeaseID{Namespace: "ns", Name: "b"}); !ok || got != b {
		t.Fatalf("get ns/b: got = %v, %v, expected: its record", got, ok)
	}
	if _, ok := x.get(LeaseID{Namespace: "other", Name: "a"}); ok {
		t.Fatalf("get other/a: got = a record, expected: none")
	}
	n := 0
	for range x.all() {
		n++
	}
	expect(t, "records yielded", n, 2)
	n = 0
	for range x.in("ns") {
		n++
	}
	for range x.in("other") {
		t.Fatalf("a record of namespace other: got = one, expected: none")
	}
	expect(t, "records of ns", n, 2)
	x.delete(a.LeaseID)
	x.delete(a.LeaseID) // twice: nothing more
	expect(t, "leases after a delete", x.len(), 1)
	x.delete(b.LeaseID)
	expect(t, "leases after both", x.len(), 0)
	expect(t, "namespaces after both", len(x.byNS), 0)
}

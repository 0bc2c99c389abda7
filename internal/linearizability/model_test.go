package linearizability

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
)

func op(client int, call, ret int64, in, out any) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

const never = math.MaxInt64

func TestKVModel(t *testing.T) {
	put := func(k, v string) KVInput { return KVInput{Op: Put, Key: k, Value: v} }
	get := func(k string) KVInput { return KVInput{Op: Get, Key: k} }
	cas := func(k, from, to string) KVInput { return KVInput{Op: CompareAndSwap, Key: k, Expect: from, Value: to} }
	ok, unknown := KVOutput{}, KVOutput{Unknown: true}
	read := func(v string) KVOutput { return KVOutput{Found: true, Value: v} }
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"a read after a write sees it", []porcupine.Operation{
			op(0, 0, 1, put("k", "1"), ok), op(1, 2, 3, get("k"), read("1")),
		}, porcupine.Ok},
		{"a read after a write that returns the older value is a stale read", []porcupine.Operation{
			op(0, 0, 1, put("k", "1"), ok), op(0, 2, 3, put("k", "2"), ok), op(1, 4, 5, get("k"), read("1")),
		}, porcupine.Illegal},
		{"a write of unknown outcome may show up much later", []porcupine.Operation{
			op(0, 0, 1, put("k", "1"), ok), op(0, 2, never, put("k", "2"), unknown),
			op(1, 10, 11, get("k"), read("1")), op(1, 12, 13, get("k"), read("2")),
		}, porcupine.Ok},
		{"a write of unknown outcome cannot be undone once seen", []porcupine.Operation{
			op(0, 0, 1, put("k", "1"), ok), op(0, 2, never, put("k", "2"), unknown),
			op(1, 10, 11, get("k"), read("2")), op(1, 12, 13, get("k"), read("1")),
		}, porcupine.Illegal},
		{"compare-and-swap swaps only on the current value", []porcupine.Operation{
			op(0, 0, 1, put("k", "1"), ok), op(0, 2, 3, cas("k", "1", "2"), KVOutput{Swapped: true}),
			op(1, 4, 5, cas("k", "1", "3"), KVOutput{}), op(1, 6, 7, get("k"), read("2")),
		}, porcupine.Ok},
		{"two compare-and-swaps from one value cannot both swap", []porcupine.Operation{
			op(0, 0, 1, put("k", "1"), ok), op(0, 2, 5, cas("k", "1", "2"), KVOutput{Swapped: true}),
			op(1, 2, 5, cas("k", "1", "3"), KVOutput{Swapped: true}),
		}, porcupine.Illegal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := porcupine.CheckOperationsTimeout(KVModel.ToModel(), tc.ops, 0); got != tc.want {
				t.Errorf("check: got = %s, expected: %s", got, tc.want)
			}
		})
	}
}

func TestLeaseModel(t *testing.T) {
	acq := func(s int64) LeaseInput { return LeaseInput{Op: Acquire, Lease: "l", Session: s} }
	rel := func(tok int64) LeaseInput { return LeaseInput{Op: Release, Lease: "l", Token: tok} }
	val := func(tok int64) LeaseInput { return LeaseInput{Op: Validate, Lease: "l", Token: tok} }
	granted := func(tok int64) LeaseOutput { return LeaseOutput{OK: true, Token: tok} }
	refused, released, unknown := LeaseOutput{}, LeaseOutput{OK: true}, LeaseOutput{Unknown: true}
	valid := func(ok bool, cur int64) LeaseOutput { return LeaseOutput{OK: ok, Token: cur} }
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"grants hand over with increasing tokens", []porcupine.Operation{
			op(0, 0, 1, acq(1), granted(5)), op(1, 2, 3, acq(2), refused), op(0, 4, 5, val(5), valid(true, 5)),
			op(0, 6, 7, rel(5), released), op(1, 8, 9, acq(2), granted(9)), op(0, 10, 11, val(5), valid(false, 9)),
		}, porcupine.Ok},
		{"two sessions cannot hold at once", []porcupine.Operation{
			op(0, 0, 1, acq(1), granted(5)), op(1, 2, 3, acq(2), granted(6)),
		}, porcupine.Illegal},
		{"a token may not go backwards", []porcupine.Operation{
			op(0, 0, 1, acq(1), granted(5)), op(0, 2, 3, rel(5), released), op(1, 4, 5, acq(2), granted(4)),
		}, porcupine.Illegal},
		{"an old token validates false once released", []porcupine.Operation{
			op(0, 0, 1, acq(1), granted(5)), op(0, 2, 3, rel(5), released), op(1, 4, 5, val(5), valid(true, 5)),
		}, porcupine.Illegal},
		{"an acquire of unknown outcome may hold the lease, revealed by validate", []porcupine.Operation{
			op(0, 0, never, acq(1), unknown), op(1, 2, 3, acq(2), refused), op(1, 4, 5, val(1), valid(false, 7)),
			op(0, 6, 7, acq(1), granted(7)), op(0, 8, 9, rel(7), released), op(1, 10, 11, acq(2), granted(12)),
		}, porcupine.Ok},
		{"a release of unknown outcome may free the lease", []porcupine.Operation{
			op(0, 0, 1, acq(1), granted(5)), op(0, 2, never, rel(5), unknown), op(1, 4, 5, acq(2), granted(8)),
		}, porcupine.Ok},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := porcupine.CheckOperationsTimeout(LeaseModel.ToModel(), tc.ops, 0); got != tc.want {
				t.Errorf("check: got = %s, expected: %s", got, tc.want)
			}
		})
	}
}

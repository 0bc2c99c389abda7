package linearizability

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// KVOp is what a key/value call does.
type KVOp int

const (
	Put KVOp = iota + 1
	Get
	// CompareAndSwap writes Value if the key exists with value Expect.
	CompareAndSwap
)

// KVInput is a key/value call.
type KVInput struct {
	Op     KVOp
	Key    string
	Value  string // Put, CompareAndSwap
	Expect string // CompareAndSwap
}

// KVOutput is a key/value call's result.
type KVOutput struct {
	// Unknown: the call may or may not have taken effect.
	Unknown bool
	// Found and Value: what a Get read.
	Found bool
	Value string
	// Swapped: a CompareAndSwap's compare held and it wrote.
	Swapped bool
}

type kvState struct {
	found bool
	value string
}

// KVModel is one register per key, with histories split per key.
var KVModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(KVInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{kvState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(kvState), input.(KVInput), output.(KVOutput)
		written := kvState{found: true, value: in.Value}
		switch in.Op {
		case Put:
			if out.Unknown {
				return []any{s, written}
			}
			return []any{written}
		case Get:
			if out.Found == s.found && out.Value == s.value {
				return []any{s}
			}
			return nil
		case CompareAndSwap:
			holds := s.found && s.value == in.Expect
			switch {
			case out.Unknown && holds:
				return []any{s, written}
			case out.Unknown:
				return []any{s}
			case out.Swapped && holds:
				return []any{written}
			case !out.Swapped && !holds:
				return []any{s}
			}
			return nil
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(KVInput), output.(KVOutput)
		res := "ok"
		switch {
		case out.Unknown:
			res = "unknown"
		case in.Op == Get && !out.Found:
			res = "absent"
		case in.Op == Get:
			res = fmt.Sprintf("%q", out.Value)
		case in.Op == CompareAndSwap && !out.Swapped:
			res = "compare failed"
		}
		switch in.Op {
		case Put:
			return fmt.Sprintf("put(%s, %q) -> %s", in.Key, in.Value, res)
		case Get:
			return fmt.Sprintf("get(%s) -> %s", in.Key, res)
		}
		return fmt.Sprintf("cas(%s, %q -> %q) -> %s", in.Key, in.Expect, in.Value, res)
	},
	DescribeState: func(state any) string {
		s := state.(kvState)
		if !s.found {
			return "absent"
		}
		return fmt.Sprintf("%q", s.value)
	},
}

package statemachine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// awkwardStrings are the byte strings every encoding on the way must keep
// as they are: empty, NUL, DEL, a lone continuation byte, 0xff, invalid
// and valid UTF-8, and prefixes whose range end carries.
var awkwardStrings = []string{
	"", "\x00", "\x7f", "\xbf", "\xff", "\xff\xfe", "\xc0\x80", "\xed\xa0\x80",
	"/c/\xff", "a\xff", "\xff\xff", "п", "пример", "日本", "\x00\x00\x00", "a\x00b",
}

// fill sets every field of the value v points to, recursively, from r:
// strings from awkwardStrings and random bytes, numbers over their whole
// range, slices and maps of one to three items, pointers set. A field
// the codec forgets comes back zero, and the round trip tells.
func fill(r *rand.Rand, v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.String:
		if r.IntN(2) == 0 {
			v.SetString(awkwardStrings[r.IntN(len(awkwardStrings)-1)+1])
			return
		}
		b := make([]byte, 1+r.IntN(12))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		v.SetString(string(b))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		n := int64(r.Uint64())
		if v.Kind() == reflect.Int && v.Type().Size() < 8 {
			n = int64(int32(n))
		}
		if n == 0 {
			n = 1
		}
		v.SetInt(n)
	case reflect.Uint8:
		v.SetUint(uint64(1 + r.IntN(255)))
	case reflect.Pointer:
		if depth > 2 {
			return // a Txn nests Txns: stop somewhere
		}
		p := reflect.New(v.Type().Elem())
		fill(r, p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		n := 1 + r.IntN(3)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			fill(r, s.Index(i), depth)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 1 + r.IntN(3) {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(r, k, depth)
			fill(r, e, depth)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(r, v.Field(i), depth)
			}
		}
	default:
		panic("fill: no rule for " + v.Type().String())
	}
}

func TestTheBinaryCodecKeepsEveryFieldOfEveryCommand(t *testing.T) {
	r := rand.New(rand.NewPCG(28, 6))
	for _, sample := range sampleCommands() {
		for range 50 {
			p := reflect.New(reflect.TypeOf(sample))
			fill(r, p.Elem(), 0)
			cmd := p.Elem().Interface().(Command)
			now := int64(r.Uint64())
			data, err := Encode(now, cmd)
			if err != nil {
				t.Fatalf("Encode(%T): %v", cmd, err)
			}
			gotNow, got, err := Decode(data)
			if err != nil {
				t.Fatalf("Decode(Encode(%#v)): %v", cmd, err)
			}
			expect(t, "now", gotNow, now)
			if !reflect.DeepEqual(got, cmd) {
				t.Fatalf("round trip of %T:\ngot = %#v\nexpected: %#v", cmd, got, cmd)
			}
		}
	}
}

func TestTheBinarySnapshotKeepsEveryField(t *testing.T) {
	r := rand.New(rand.NewPCG(28, 7))
	for range 50 {
		var snap snapshot
		fill(r, reflect.ValueOf(&snap).Elem(), 0)
		snap.Version = snapshotVersion
		e := encoder{b: append([]byte(nil), binarySnapshotMagic...)}
		e.uint(binarySnapshotFormat)
		snap.encode(&e)
		got, err := readSnapshot(bytes.NewReader(e.b))
		if err != nil {
			t.Fatalf("readSnapshot: %v", err)
		}
		if !reflect.DeepEqual(got, snap) {
			t.Fatalf("round trip:\ngot = %#v\nexpected: %#v", got, snap)
		}
	}
}

func TestKeysAndValuesKeepEveryByteThroughTheLog(t *testing.T) {
	for _, s := range awkwardStrings {
		cmd := Txn{
			Compares: []TxnCompare{{Key: "k" + s, End: s + "\xff", Target: TargetValue, Op: CmpEqual, Value: s}},
			Success:  []TxnOp{{Type: OpPut, Key: s + "k", Value: s}, {Type: OpDelete, Key: s + "a", End: s + "b"}},
		}
		data, err := EncodeFor(Version, 1, cmd)
		if err != nil {
			t.Fatalf("EncodeFor(%d, %q): %v", Version, s, err)
		}
		_, got, err := Decode(data)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		expect(t, "Txn of "+s, got, Command(cmd))
	}
}

func TestTheJSONFormRefusesWhatItWouldRewrite(t *testing.T) {
	for _, cmd := range []Command{
		Put{Key: "/b", Value: "\xff\xfe"},
		Put{Key: "/c/\xff", Value: "one"},
		Delete{Key: "\xbf"},
		Txn{Success: []TxnOp{{Type: OpDelete, Key: "/u/п", End: "/u/\xd0\xc0"}}},
		Txn{Compares: []TxnCompare{{Key: "k", Target: TargetValue, Value: "\xfe"}}},
		Txn{Failure: []TxnOp{{Type: OpTxn, Txn: &Txn{Success: []TxnOp{{Type: OpPut, Key: "k", Value: "\x80"}}}}}},
		CompareAndSwap{Key: "k", Target: CompareValue, Value: "\xc0"},
	} {
		for _, version := range []int{1, BinaryVersion - 1} {
			if _, err := EncodeFor(version, 1, cmd); !errors.Is(err, ErrNotUTF8) || !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "upgrade every member") {
				t.Errorf("EncodeFor(%d, %#v): got = %v, expected: %v, which is %v, saying what to do", version, cmd, err, ErrNotUTF8, ErrNotSupported)
			}
		}
		if _, err := EncodeFor(BinaryVersion, 1, cmd); err != nil {
			t.Errorf("EncodeFor(%d, %#v): got = %v, expected: nil", BinaryVersion, cmd, err)
		}
	}
	// Text that is UTF-8, "п" and U+FFFD itself among it, still goes as
	// JSON, in the form older builds read.
	cmd := Put{Key: "/u/п", Value: "\uFFFD日本"}
	data, err := EncodeFor(BinaryVersion-1, 1, cmd)
	if err != nil {
		t.Fatalf("EncodeFor(%d, UTF-8): %v", BinaryVersion-1, err)
	}
	expect(t, "kind byte", data[0], byte(KindPut))
	expect(t, "body", string(data[headerLen:]), `{"key":"/u/п","value":"`+"\uFFFD"+`日本"}`)
}

// binaryEntry is a binary entry of kind k with body, at time 42.
func binaryEntry(k Kind, body ...byte) []byte {
	b := make([]byte, headerLen, headerLen+len(body))
	b[0] = byte(k) | binaryFlag
	binary.BigEndian.PutUint64(b[1:], 42)
	return append(b, body...)
}

// The bound on nested Txns refuses one more (TestDecodeErrors), not the
// bound itself.
func TestDecodeTakesTxnsNestedToTheBound(t *testing.T) {
	if _, _, err := Decode(binaryEntry(KindTxn, deepTxn(maxTxnDepth)...)); err != nil {
		t.Errorf("Txns nested %d deep: got = %v, expected: nil", maxTxnDepth, err)
	}
}

// deepTxn is the body of a Txn nesting n Txns, each one operation of the
// one before it.
func deepTxn(n int) []byte {
	var e encoder
	var nest func(depth int)
	nest = func(depth int) {
		e.uint(0) // compares
		if depth == n {
			e.uint(0) // success
		} else {
			e.uint(1) // success: one nested Txn
			e.uint(uint64(OpTxn))
			e.str("")
			e.str("")
			e.int(0)
			e.str("")
			e.int(0)
			e.bool(false)
			e.bool(false)
			e.bool(true)
			nest(depth + 1)
		}
		e.uint(0)     // failure
		e.bool(false) // actor
	}
	nest(1)
	return e.b
}

// The log's encoding runs on every proposal and every apply: the binary
// form against the JSON one, per command of the kinds the hot paths
// propose (go test -run '^$' -bench Codec ./statemachine).
func BenchmarkCodec(b *testing.B) {
	actor := &Actor{Principal: "app", Identities: []string{"app-*"}}
	cmds := []Command{
		Acquire{SessionID: 1234567, Lease: LeaseID{Namespace: "default", Name: "scheduler"}, Capacity: 1, Wait: true, GCAfter: gcAfter, Actor: actor},
		Release{Lease: LeaseID{Namespace: "default", Name: "scheduler"}, Token: 1234590, Actor: actor},
		Txn{
			Compares: []TxnCompare{{Key: "/registry/pods/default/web-1", Target: TargetMod, Op: CmpEqual, Number: 4242}},
			Success:  []TxnOp{{Type: OpPut, Key: "/registry/pods/default/web-1", Value: strings.Repeat("k8s", 341)}},
			Failure:  []TxnOp{{Type: OpRange, Key: "/registry/pods/default/web-1"}},
		},
	}
	for _, cmd := range cmds {
		for _, form := range []struct {
			name   string
			encode func(int64, Command) ([]byte, error)
		}{{"binary", Encode}, {"json", EncodeJSON}} {
			data, err := form.encode(1, cmd)
			if err != nil {
				b.Fatal(err)
			}
			name := fmt.Sprintf("%T/%s", cmd, form.name)
			b.Run(name+"/encode", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_, _ = form.encode(1, cmd)
				}
			})
			b.Run(name+"/decode", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_, _, _ = Decode(data)
				}
			})
		}
	}
}

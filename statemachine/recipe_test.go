package statemachine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// recipePut is the Txn an etcd recipe's contender writes: its key under
// pfx, attached to its lease (concurrency.Mutex.tryAcquire's put).
func recipePut(pfx string, lease int64, value string) Txn {
	return Txn{Success: []TxnOp{{Type: OpPut, Key: fmt.Sprintf("%s%x", pfx, lease), Value: value, Lease: lease}}}
}

// contenders is a lock's contenders as "key@createRevision/session".
func contenders(l RecipeLock) []string {
	var out []string
	for _, c := range l.Contenders {
		out = append(out, fmt.Sprintf("%s@%d/%d", c.Key, c.CreateRevision, c.SessionID))
	}
	return out
}

func TestRecipeLocks(t *testing.T) {
	m := New()
	step := int64(0)
	apply := func(cmd Command) Result {
		t.Helper()
		step += setupTick
		res := m.Apply(step, cmd)
		if res.Err != nil {
			t.Fatalf("Apply(%#v): %v", cmd, res.Err)
		}
		return res
	}
	apply(SetVersion{Version: BinaryVersion})
	a := apply(OpenSession{Identity: "alice", TTL: ttl, LeaseID: 0x694d}).Session
	b := apply(OpenSession{Identity: "bob", TTL: ttl}).Session
	c := apply(OpenSession{Identity: "carol", TTL: ttl, LeaseID: 0xabc}).Session

	// bob joins first, then alice, then carol: bob holds, the others wait
	// in that order whatever their keys' or sessions' order.
	apply(recipePut("locks/db/", b.EtcdLeaseID(), ""))
	apply(recipePut("locks/db/", a.EtcdLeaseID(), ""))
	apply(recipePut("locks/db/", c.EtcdLeaseID(), ""))
	// An election under a name that is not UTF-8, with NUL and 0xff.
	apply(recipePut("el\x00\xff/", a.EtcdLeaseID(), "leader-a"))
	// Keys that only look like recipe keys: hex of another lease; the
	// right hex but attached to no lease; upper-case hex; no "/" at all.
	apply(recipePut("fake/", a.EtcdLeaseID(), ""))
	apply(Txn{Success: []TxnOp{{Type: OpPut, Key: fmt.Sprintf("fake/%x", c.EtcdLeaseID()), Lease: a.EtcdLeaseID()}}})
	apply(Put{Key: fmt.Sprintf("bare/%x", b.EtcdLeaseID())})
	apply(Txn{Success: []TxnOp{{Type: OpPut, Key: fmt.Sprintf("upper/%X", a.EtcdLeaseID()), Lease: a.EtcdLeaseID()}}})
	apply(Txn{Success: []TxnOp{{Type: OpPut, Key: fmt.Sprintf("%x", a.EtcdLeaseID()), Lease: a.EtcdLeaseID()}}})

	kv := func(key string) int64 {
		k, ok := m.Key(key)
		if !ok {
			t.Fatalf("key %q is missing", key)
		}
		return k.CreateRevision
	}
	got := map[string][]string{}
	for _, l := range m.RecipeLocks() {
		got[l.Prefix] = contenders(l)
	}
	expected := map[string][]string{
		"locks/db/": {
			fmt.Sprintf("locks/db/%x@%d/%d", b.EtcdLeaseID(), kv(fmt.Sprintf("locks/db/%x", b.EtcdLeaseID())), b.ID),
			fmt.Sprintf("locks/db/694d@%d/%d", kv("locks/db/694d"), a.ID),
			fmt.Sprintf("locks/db/abc@%d/%d", kv("locks/db/abc"), c.ID),
		},
		"el\x00\xff/": {fmt.Sprintf("el\x00\xff/694d@%d/%d", kv("el\x00\xff/694d"), a.ID)},
		"fake/":       {fmt.Sprintf("fake/694d@%d/%d", kv("fake/694d"), a.ID)},
	}
	if fmt.Sprint(got) != fmt.Sprint(expected) {
		t.Fatalf("RecipeLocks:\ngot      = %q\nexpected: %q", got, expected)
	}
	locks := m.RecipeLocks()
	if !slices.IsSortedFunc(locks, func(x, y RecipeLock) int { return strings.Compare(x.Prefix, y.Prefix) }) {
		t.Errorf("RecipeLocks not sorted by prefix: %+v", locks)
	}
	for _, l := range locks {
		if l.Prefix != "el\x00\xff/" {
			continue
		}
		if c := l.Contenders[0]; c.Value != "leader-a" || c.Identity != "alice" || c.EtcdLease != 0x694d {
			t.Errorf("election's leader: got = %+v, expected: value leader-a, identity alice, lease 694d", c)
		}
	}

	// The holder's session closes: its key goes, alice holds, carol waits.
	apply(CloseSession{SessionID: b.ID})
	got = map[string][]string{}
	for _, l := range m.RecipeLocks() {
		got[l.Prefix] = contenders(l)
	}
	handover := []string{
		fmt.Sprintf("locks/db/694d@%d/%d", kv("locks/db/694d"), a.ID),
		fmt.Sprintf("locks/db/abc@%d/%d", kv("locks/db/abc"), c.ID),
	}
	if !slices.Equal(got["locks/db/"], handover) {
		t.Errorf("after the holder's session closed: got = %q, expected: %q", got["locks/db/"], handover)
	}

	// Unlock is a delete of the holder's key: carol holds alone.
	apply(Delete{Key: "locks/db/694d"})
	got = map[string][]string{}
	for _, l := range m.RecipeLocks() {
		got[l.Prefix] = contenders(l)
	}
	if expected := []string{fmt.Sprintf("locks/db/abc@%d/%d", kv("locks/db/abc"), c.ID)}; !slices.Equal(got["locks/db/"], expected) {
		t.Errorf("after the holder unlocked: got = %q, expected: %q", got["locks/db/"], expected)
	}
	// A key put again without its lease is no recipe key any more.
	apply(Put{Key: "locks/db/abc"})
	for _, l := range m.RecipeLocks() {
		if l.Prefix == "locks/db/" {
			t.Errorf("a key detached from its lease still counts: %q", contenders(l))
		}
	}
}

func TestRecipePrefix(t *testing.T) {
	for _, tc := range []struct {
		name   string
		key    string
		lease  int64
		prefix string
		ok     bool
	}{
		{"a mutex's key is its name and slash", "m/694d", 0x694d, "m/", true},
		{"a name may hold slashes: the last segment counts", "a/b/c/1f", 0x1f, "a/b/c/", true},
		{"the empty name gives the prefix slash", "/1f", 0x1f, "/", true},
		{"hex of another lease is no recipe key", "m/694d", 0x694e, "", false},
		{"a key attached to no lease is none", "m/0", 0, "", false},
		{"upper-case hex is not what the recipes write", "m/ABC", 0xabc, "", false},
		{"leading zeros are not what the recipes write", "m/0abc", 0xabc, "", false},
		{"a key without a slash is none", "abc", 0xabc, "", false},
		{"bytes that are not UTF-8 stay in the prefix", "\xff\x00/abc", 0xabc, "\xff\x00/", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix, ok := RecipePrefix(tc.key, tc.lease)
			if prefix != tc.prefix || ok != tc.ok {
				t.Errorf("RecipePrefix(%q, %x): got = %q, %v, expected: %q, %v", tc.key, tc.lease, prefix, ok, tc.prefix, tc.ok)
			}
		})
	}
}

package raftnode

import (
	"errors"
	"maps"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/tenurehq/tenure/statemachine"
)

// lastCommand is the newest command entry of n's log, as it is stored.
func lastCommand(t *testing.T, n *Node) []byte {
	t.Helper()
	last, err := n.engine.ms.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	ents, err := n.engine.ms.Entries(last, last+1, 1<<30)
	if err != nil || len(ents) != 1 || ents[0].Type != raftpb.EntryNormal || len(ents[0].Data) <= proposalHeader {
		t.Fatalf("last entry: got = %v (%v), expected: one command", ents, err)
	}
	return ents[0].Data[proposalHeader:]
}

// A cluster whose version is below statemachine.BinaryVersion may have a
// member that reads only JSON: until the version is raised, every entry
// is JSON, and a command that JSON would rewrite is refused and changes
// nothing. From the raise on, entries are binary and keep every byte,
// and a restart replays both forms.
func TestTheLogIsJSONUntilTheClusterVersionReadsBinary(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "wal")
	n := openLeader(t, cfg)
	propose := func(cmd statemachine.Command) statemachine.Result {
		t.Helper()
		res, err := n.Propose(ctxT(t), cmd)
		if err != nil || res.Err != nil {
			t.Fatalf("Propose(%#v): got = %v, %v, expected: nil", cmd, err, res.Err)
		}
		return res
	}
	propose(statemachine.SetVersion{Version: statemachine.BinaryVersion - 1})
	propose(statemachine.Txn{Success: []statemachine.TxnOp{{Type: statemachine.OpPut, Key: "text", Value: "п"}}})
	if form := lastCommand(t, n)[0]; form != byte(statemachine.KindTxn) {
		t.Fatalf("kind byte at cluster version %d: got = %#x, expected: %#x (JSON)", statemachine.BinaryVersion-1, form, statemachine.KindTxn)
	}
	binary := statemachine.Txn{Success: []statemachine.TxnOp{{Type: statemachine.OpPut, Key: "/c/\xff", Value: "\xff\xfe"}}}
	if _, err := n.Propose(ctxT(t), binary); !errors.Is(err, statemachine.ErrNotSupported) {
		t.Fatalf("a key that is not UTF-8 at cluster version %d: got = %v, expected: %v", statemachine.BinaryVersion-1, err, statemachine.ErrNotSupported)
	}
	// A binary entry that reached the log below the version anyway (a
	// leader of a newer build, say) is refused on every replica, as a
	// member of the older build, unable to decode it, refuses it.
	raw, err := statemachine.Encode(1, binary)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := n.engine.propose(ctxT(t), "propose", raw); err != nil || !errors.Is(res.Err, statemachine.ErrNotSupported) {
		t.Fatalf("a binary entry at cluster version %d: got = %v, %v, expected: %v", statemachine.BinaryVersion-1, err, res.Err, statemachine.ErrNotSupported)
	}
	if kv := machineKeys(t, n); len(kv) != 1 {
		t.Fatalf("keys after the refusals: got = %q, expected: only text", kv)
	}

	propose(statemachine.SetVersion{Version: statemachine.BinaryVersion})
	propose(binary)
	if form := lastCommand(t, n)[0]; form&0x80 == 0 {
		t.Fatalf("kind byte at cluster version %d: got = %#x, expected: the binary flag set", statemachine.BinaryVersion, form)
	}
	want := map[string]string{"text": "п", "/c/\xff": "\xff\xfe"}
	if kv := machineKeys(t, n); !maps.Equal(kv, want) {
		t.Fatalf("keys: got = %q, expected: %q", kv, want)
	}

	// A restart replays the JSON entries and the binary ones alike.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openLeader(t, cfg)
	if kv := machineKeys(t, n); !maps.Equal(kv, want) {
		t.Fatalf("keys after a restart: got = %q, expected: %q", kv, want)
	}
	propose(statemachine.Txn{Success: []statemachine.TxnOp{{Type: statemachine.OpPut, Key: "\x00", Value: "\x00"}}})
	if form := lastCommand(t, n)[0]; form&0x80 == 0 {
		t.Fatalf("kind byte after a restart: got = %#x, expected: the binary flag set", form)
	}
}

// machineKeys is every key of n's machine and its value.
func machineKeys(t *testing.T, n *Node) map[string]string {
	t.Helper()
	kv := map[string]string{}
	err := n.Read(ctxT(t), func(m *statemachine.Machine) error {
		all, _ := m.Range("", 0)
		for _, k := range all {
			kv[k.Key] = k.Value
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// openLeader opens a node of the real state machine on cfg, closed when
// the test ends, and waits for it to lead.
func openLeader(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	waitLeader(t, n)
	return n
}

package raftnode

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/testnet"
	"github.com/tenurehq/tenure/statemachine"
)

func TestASeededNodeCarriesOnFromTheSnapshot(t *testing.T) {
	t.Parallel()
	src, err := Open(testConfig(t.TempDir(), "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	waitLeader(t, src)
	res, err := src.Propose(ctxT(t), statemachine.OpenSession{Identity: "alice", TTL: int64(10 * time.Second)})
	if err != nil || res.Err != nil {
		t.Fatalf("open session: %v %v", err, res.Err)
	}
	lease := statemachine.LeaseID{Namespace: "default", Name: "report"}
	res, err = src.Propose(ctxT(t), statemachine.Acquire{SessionID: res.Session.ID, Lease: lease, Capacity: 1})
	if err != nil || res.Err != nil {
		t.Fatalf("acquire: %v %v", err, res.Err)
	}
	held := res.Grant.Token
	var snap bytes.Buffer
	var srcRevision int64
	if err := src.Read(ctxT(t), func(m *statemachine.Machine) error {
		srcRevision = m.Revision()
		return m.Snapshot(&snap)
	}); err != nil {
		t.Fatal(err)
	}
	saved := snap.Bytes()

	cfg := testConfig(t.TempDir(), "wal")
	cfg.NodeID, cfg.PeerAddr = "restored", testnet.Free(t)
	rev, err := Seed(cfg, bytes.NewReader(saved))
	if err != nil {
		t.Fatalf("Seed: %v", err)
	}
	if rev != srcRevision {
		t.Errorf("Seed returned revision %d, expected the snapshot's %d", rev, srcRevision)
	}
	if _, err := Seed(cfg, bytes.NewReader(saved)); !errors.Is(err, ErrHasState) {
		t.Errorf("seeding twice: got = %v, expected ErrHasState", err)
	}

	n, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open on the seeded dir: %v", err)
	}
	defer n.Close()
	waitLeader(t, n)
	var holder int64
	if err := n.Read(ctxT(t), func(m *statemachine.Machine) error {
		l, ok := m.Lease(lease)
		if !ok || len(l.Holders) != 1 {
			t.Fatalf("lease after seeding = %+v, %v; expected alice's grant", l, ok)
		}
		holder = l.Holders[0].SessionID
		if l.Holders[0].Token != held {
			t.Errorf("token after seeding = %d, expected %d", l.Holders[0].Token, held)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	res, err = n.Propose(ctxT(t), statemachine.Release{Lease: lease, Token: held})
	if err != nil || res.Err != nil {
		t.Fatalf("release the seeded grant: %v %v", err, res.Err)
	}
	res, err = n.Propose(ctxT(t), statemachine.Acquire{SessionID: holder, Lease: lease, Capacity: 1})
	if err != nil || res.Err != nil {
		t.Fatalf("acquire after seeding: %v %v", err, res.Err)
	}
	if res.Grant.Token <= srcRevision {
		t.Errorf("token after seeding = %d, expected above the snapshot's revision %d", res.Grant.Token, srcRevision)
	}
	members, err := n.Members()
	if err != nil || len(members) != 1 || members[0].ID != "restored" || !members[0].Voter {
		t.Errorf("members after seeding = %+v, %v; expected restored alone, voting", members, err)
	}
}

func TestSeedRefusesADamagedSnapshotAndChangesNothing(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t.TempDir(), "wal")
	cfg.PeerAddr = testnet.Free(t)
	_, err := Seed(cfg, strings.NewReader(`{"version":1,"revision":3,"sessions":[`))
	if err == nil || !strings.Contains(err.Error(), "read snapshot") {
		t.Fatalf("Seed(truncated) = %v, expected a read snapshot error", err)
	}
	_, err = Seed(cfg, strings.NewReader(`{"version":1,"revision":3,"leases":[{"namespace":"default","name":"x","holders":[{"session_id":9,"token":2}]}]}`))
	if err == nil || !strings.Contains(err.Error(), "session 9") {
		t.Fatalf("Seed(grant of a missing session) = %v, expected it named", err)
	}
	cfg.Bootstrap = false
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Formed() {
		t.Error("a refused seed left a cluster configuration behind")
	}
}

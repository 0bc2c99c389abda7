//go:build linux

package etcd

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/testnet"
)

// TestEtcdctlAdmin runs etcdctl's maintenance and membership commands
// against etcd and against Tenure, as TestEtcdctl does, and requires the
// same output: HashKV's hashes included, which Tenure computes as etcd
// does over the same history.
func TestEtcdctlAdmin(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("etcdctl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("etcdctl is not installed (scripts/install-etcd.sh installs it): %v", err)
		}
		t.Skipf("etcdctl is not installed (scripts/install-etcd.sh installs it): %v", err)
	}
	ref, sut, ok := pair(t)
	want := transcript(t, ref, ctlAdmin)
	if !ok {
		t.Logf("etcd's transcript:\n%s", want)
		return
	}
	got := transcript(t, sut, ctlAdmin)
	compareTranscripts(t, want, got)
}

func ctlAdmin(c *ctl) {
	c.run("put", "a", "1")
	c.run("put", "b", "2")
	c.runIn("\nput c 3\nput a 4\n\n\n", "txn") // one revision, two places in it
	c.run("del", "b")
	c.run("put", "a", "5")
	c.run("endpoint", "hashkv", "-w", "json")
	c.run("endpoint", "hashkv", "--rev", "3", "-w", "json")
	c.run("compaction", "4")
	c.run("endpoint", "hashkv", "-w", "json")
	// (At the compact revision itself etcd 3.4 answers "compacted", 3.5
	// and Tenure the hash; neither at 5.)
	c.run("endpoint", "hashkv", "--rev", "5", "-w", "json")
	c.run("endpoint", "hashkv", "--rev", "2")
	c.run("endpoint", "hashkv", "--rev", "100")
	c.run("defrag")
	c.run("alarm", "list")
	c.run("alarm", "disarm")

	// etcdctl checks the stream's length (whole pages and a sha256).
	file := filepath.Join(c.t.TempDir(), "snap.db")
	out, code := c.exec("", "snapshot", "save", file)
	c.record(strings.ReplaceAll(out, file, "FILE"), code, "snapshot", "save", "FILE")
	if fi, err := os.Stat(file); err != nil || fi.Size()%512 != 32 {
		fmt.Fprintf(&c.out, "(snapshot file: %v, expected whole pages and a sha256)\n", err)
	}

	self := c.memberIDs()[0]
	c.runAs(map[string]string{self: "SELF"}, nil, "member", "promote", self)
	c.run("member", "remove", "1")
	c.run("member", "update", "1", "--peer-urls=http://127.0.0.1:1")
	c.runAs(map[string]string{self: "SELF"}, nil, "move-leader", self)

	// A learner that never starts: it cannot be promoted, and goes.
	peer := "http://" + testnet.FreeN(c.t, 1)[0]
	// The members are listed by ID, which differ between the servers:
	// only what the answer says of the new one is compared.
	c.runAs(map[string]string{"--peer-urls=" + peer: "--peer-urls=PEER"}, addedMember, "member", "add", "new", "--learner", "--peer-urls="+peer, "-w", "json")
	ids := c.memberIDs()
	if len(ids) != 2 {
		fmt.Fprintf(&c.out, "(members after the add: %v)\n", ids)
		return
	}
	learner := ids[1]
	c.runAs(map[string]string{learner: "NEW"}, nil, "member", "promote", learner)
	c.runAs(map[string]string{learner: "NEW"}, memberCount, "member", "remove", learner, "-w", "json")
	if ids := c.memberIDs(); len(ids) != 1 {
		fmt.Fprintf(&c.out, "(members after the remove: %v)\n", ids)
	}
}

// record writes a command run with exec into the transcript.
func (c *ctl) record(out string, code int, args ...string) {
	fmt.Fprintf(&c.out, "$ etcdctl %s\n%s", strings.Join(args, " "), out)
	if code != 0 {
		fmt.Fprintf(&c.out, "(exit %d)\n", code)
	}
}

// memberAnswer is a member change's answer, as etcdctl -w json prints it.
type memberAnswer struct {
	Member *struct {
		Name      string   `json:"name"`
		PeerURLs  []string `json:"peerURLs"`
		IsLearner bool     `json:"isLearner"`
	} `json:"member"`
	Members []struct {
		Name      string `json:"name"`
		IsLearner bool   `json:"isLearner"`
	} `json:"members"`
}

func (a memberAnswer) String() string {
	started, learners := 0, 0
	for _, m := range a.Members {
		if m.Name != "" {
			started++
		}
		if m.IsLearner {
			learners++
		}
	}
	return fmt.Sprintf("%d members, %d started, %d learners", len(a.Members), started, learners)
}

// addedMember is what MemberAdd's answer says of the new member, and
// how many members it lists.
func addedMember(out string) string {
	var a memberAnswer
	if err := json.Unmarshal([]byte(out), &a); err != nil || a.Member == nil {
		return out
	}
	return fmt.Sprintf("added: name %q, %d peer URLs, learner %v; %v\n", a.Member.Name, len(a.Member.PeerURLs), a.Member.IsLearner, a)
}

// memberCount is how many members a change's answer lists.
func memberCount(out string) string {
	var a memberAnswer
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		return out
	}
	return a.String() + "\n"
}

// runAs is run with the words of replace replaced, in the command and
// its output (member IDs and addresses, which differ between servers),
// and its output passed through filter, when there is one.
func (c *ctl) runAs(replace map[string]string, filter func(string) string, args ...string) {
	out, code := c.exec("", args...)
	if filter != nil {
		out = filter(out)
	}
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = a
		if r, ok := replace[a]; ok {
			shown[i] = r
		}
	}
	for from, to := range replace {
		out = strings.ReplaceAll(out, from, to)
	}
	c.record(out, code, shown...)
}

// memberIDs are the members' IDs in hex, as etcdctl takes them: the
// started ones (with a name) first.
func (c *ctl) memberIDs() []string {
	out, _ := c.exec("", "member", "list", "-w", "json")
	var resp struct {
		Members []struct {
			ID   uint64 `json:"ID"`
			Name string `json:"name"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		c.t.Errorf("%s: member list: %v: %q", c.tg.name, err, out)
		return nil
	}
	var started, unstarted []string
	for _, m := range resp.Members {
		if m.Name != "" {
			started = append(started, strconv.FormatUint(m.ID, 16))
		} else {
			unstarted = append(unstarted, strconv.FormatUint(m.ID, 16))
		}
	}
	return append(started, unstarted...)
}

// TestEtcdctlSnapshotRestoresIntoANewTenureNode saves a snapshot with
// etcdctl through Tenure's etcd API, restores it with tenure snapshot
// restore, and reads the keys from the node started on it.
func TestEtcdctlSnapshotRestoresIntoANewTenureNode(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("etcdctl"); err != nil {
		t.Skipf("etcdctl is not installed (scripts/install-etcd.sh installs it): %v", err)
	}
	addr, ok := startTenure(t)
	if !ok {
		t.Skip("no etcd API in this tenure binary")
	}
	c := &ctl{t: t, tg: target{name: "tenure", addr: addr}}
	for i := range 20 {
		if out, code := c.exec("", "put", fmt.Sprintf("k%02d", i), strings.Repeat("v", i)); code != 0 {
			t.Fatalf("put: %s", out)
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "snap.db")
	if out, code := c.exec("", "snapshot", "save", file); code != 0 || !strings.Contains(out, "Snapshot saved at "+file) {
		t.Fatalf("etcdctl snapshot save: got = exit %d, %q, expected: saved", code, out)
	}
	addrs := testnet.FreeN(t, 3)
	bin := tenureBinary(t)
	data := filepath.Join(dir, "restored")
	out, err := exec.Command(bin, "snapshot", "restore", file, "--data-dir", data, "--peer-listen", addrs[1]).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "restored revision") {
		t.Fatalf("tenure snapshot restore: got = %v, %s, expected: restored", err, out)
	}
	args := []string{"serve", "--listen", addrs[0], "--peer-listen", addrs[1], "--etcd-listen", addrs[2], "--data-dir", data}
	p := startProc(t, "restored", bin, args, filepath.Join(dir, "restored.log"))
	p.waitFor(t, tenureReady(addrs))
	r := &ctl{t: t, tg: target{name: "restored", addr: addrs[2]}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, code := r.exec("", "get", "--prefix", "k", "--keys-only")
		if code == 0 && strings.Count(out, "k") == 20 && strings.Contains(out, "k19") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys on the restored node: got = exit %d, %q, expected: k00 to k19", code, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

//go:build linux

package etcd

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/proccluster"
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

// TestEtcdctlAddLearnerThenPromote runs etcd's runbook for a new member
// on a Tenure cluster: etcdctl member add --learner, start the node,
// etcdctl member promote once it is in sync. The learner waits for the
// promotion (Tenure does not give it its vote itself), then votes, can
// lead (move-leader), and hashes the keys as the first node does.
func TestEtcdctlAddLearnerThenPromote(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("etcdctl"); err != nil {
		t.Skipf("etcdctl is not installed (scripts/install-etcd.sh installs it): %v", err)
	}
	bin := tenureBinary(t)
	dir := t.TempDir()
	a1, a2 := testnet.FreeN(t, 3), testnet.FreeN(t, 3)
	p1 := startProc(t, "tenure-1", bin, tenureArgs(a1, filepath.Join(dir, "1"), true), filepath.Join(dir, "1.log"))
	p1.waitFor(t, tenureReady(a1))
	c1 := &ctl{t: t, tg: target{name: "node 1", addr: a1[2]}}
	must := func(c *ctl, want string, args ...string) string {
		t.Helper()
		out, code := c.exec("", args...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("etcdctl %s: got = exit %d, %q, expected: %q", strings.Join(args, " "), code, out, want)
		}
		return out
	}
	must(c1, "OK", "put", "k", "before")
	must(c1, " added to cluster ", "member", "add", "n2", "--learner", "--peer-urls=http://"+a2[1])
	list := func(c *ctl) map[string]memberState {
		t.Helper()
		out := must(c, `"members"`, "member", "list", "-w", "json")
		return memberStates(t, out)
	}
	id2 := memberIDOf(a2[1])
	if m := list(c1)[id2]; !m.IsLearner || m.Name != "" {
		t.Fatalf("the member added: got = %+v, expected: an unstarted learner", m)
	}

	p2 := startProc(t, "tenure-2", bin, append(tenureArgs(a2, filepath.Join(dir, "2"), true), "--join", a1[0]), filepath.Join(dir, "2.log"))
	c2 := &ctl{t: t, tg: target{name: "node 2", addr: a2[2]}}
	deadline := time.Now().Add(20 * time.Second)
	for m := list(c1)[id2]; m.Name == ""; m = list(c1)[id2] {
		if time.Now().After(deadline) {
			t.Fatalf("node 2 never started: %+v\n%s", m, tailOf(p2))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Several rounds of the node's membership loop (every second): a
	// node that joined by itself would have asked for its vote by now.
	time.Sleep(3 * time.Second)
	if m := list(c1)[id2]; !m.IsLearner {
		t.Fatalf("node 2 before its promotion: got = %+v, expected: still a learner", m)
	}
	for {
		out, code := c1.exec("", "member", "promote", id2)
		if code == 0 && strings.Contains(out, " promoted in cluster ") {
			break
		}
		if !strings.Contains(out, "in sync with leader") || time.Now().After(deadline) {
			t.Fatalf("member promote: got = exit %d, %q, expected: promoted", code, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for id, m := range list(c2) {
		if m.IsLearner || m.Name == "" {
			t.Errorf("member %s after the promotion: got = %+v, expected: a started voter", id, m)
		}
	}
	both := &ctl{t: t, tg: target{name: "both", addr: a1[2] + "," + a2[2]}}
	must(both, "Leadership transferred from ", "move-leader", id2)
	if out := must(c2, `"leader"`, "endpoint", "status", "-w", "json"); !strings.Contains(out, fmt.Sprintf(`"leader":%d`, mustParseHex(t, id2))) {
		t.Errorf("leader after move-leader: got = %s, expected: node 2 (%s)", out, id2)
	}
	must(both, "OK", "put", "k", "after")
	var hashes []string
	for _, c := range []*ctl{c1, c2} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			out := must(c, `"hash"`, "endpoint", "hashkv", "-w", "json", "--rev", "3")
			if h := hashOf(out); h != "" || time.Now().After(deadline) {
				hashes = append(hashes, h)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if hashes[0] == "" || hashes[0] != hashes[1] {
		t.Errorf("hashkv at revision 3: got = %v, expected: the same on both members", hashes)
	}
	must(c2, " removed from cluster ", "member", "remove", memberIDOf(a1[1]))
	must(c2, "OK", "put", "k", "alone")
	if n := len(list(c2)); n != 1 {
		t.Errorf("members after the remove: got = %d, expected: 1", n)
	}
}

type memberState struct {
	Name      string `json:"name"`
	IsLearner bool   `json:"isLearner"`
}

// memberStates are the members member list -w json prints, by hex ID.
func memberStates(t *testing.T, out string) map[string]memberState {
	t.Helper()
	var resp struct {
		Members []struct {
			ID uint64 `json:"ID"`
			memberState
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("member list: %v: %q", err, out)
	}
	ms := map[string]memberState{}
	for _, m := range resp.Members {
		ms[strconv.FormatUint(m.ID, 16)] = m.memberState
	}
	return ms
}

// memberIDOf is the etcd member ID of the Tenure node whose ID is id (a
// node's ID is its peer address by default): FNV-1a 64 of it, in hex.
func memberIDOf(id string) string {
	h := fnv.New64a()
	h.Write([]byte(id))
	return strconv.FormatUint(h.Sum64(), 16)
}

func mustParseHex(t *testing.T, s string) uint64 {
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var hashRE = regexp.MustCompile(`"hash":(\d+)`)

func hashOf(out string) string {
	if m := hashRE.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

func tailOf(p *proc) string { return proccluster.Tail(p.log, 30) }

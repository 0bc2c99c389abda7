package cli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/statemachine"
)

// Save writes a file the state machine restores to the same revision;
// restore seeds an empty data dir with it, prints the serve command
// that starts that node, and refuses a data dir with raft state.
func TestSnapshotSaveThenRestore(t *testing.T) {
	addr := testserver.Start(t, testserver.Limits())
	if _, stderr, code := runMain("--endpoints", addr, "kv", "put", "k", "v"); code != ExitOK {
		t.Fatalf("kv put: exit %d: %s", code, stderr)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "backup.snap")
	if err := os.WriteFile(file, []byte("an older backup"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runMain("--endpoints", addr, "snapshot", "save", file)
	if code != ExitOK {
		t.Fatalf("snapshot save: exit code got = %d, expected: 0 (stderr %q)", code, stderr)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := statemachine.New()
	if err := m.Restore(strings.NewReader(string(b))); err != nil {
		t.Fatalf("the saved file does not restore: %v", err)
	}
	if want := "saved revision 1 to " + file + " (" + strconv.Itoa(len(b)) + " bytes)\n"; stdout != want || m.Revision() != 1 {
		t.Errorf("snapshot save: got = %q, revision %d in the file, expected: %q", stdout, m.Revision(), want)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("files next to the snapshot got = %v, expected: only it (no temporary file left)", entries)
	}

	data := filepath.Join(dir, "restored")
	stdout, stderr, code = runMain("snapshot", "restore", file, "--data-dir", data, "--peer-listen", "127.0.0.1:17481", "--log-store", "boltdb")
	if code != ExitOK {
		t.Fatalf("snapshot restore: exit code got = %d, expected: 0 (stderr %q)", code, stderr)
	}
	for _, want := range []string{
		"restored revision 1 from " + file + " into " + data + " as node 127.0.0.1:17481, the only voter of a new cluster\n",
		"\n  tenure serve --data-dir " + data + " --peer-listen 127.0.0.1:17481 --log-store boltdb\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("snapshot restore: stdout got = %q, expected it to contain %q", stdout, want)
		}
	}

	stdout, stderr, code = runMain("snapshot", "restore", file, "--data-dir", data, "--peer-listen", "127.0.0.1:17481", "--log-store", "boltdb")
	want := "Error: --data-dir " + data + " already holds a node's raft state: restore only into an empty directory (a new node), never over a node's history\n"
	if code != ExitUsage || stderr != want || stdout != "" {
		t.Errorf("restore over a restored node: got = exit %d, stderr %q, stdout %q, expected: exit 2, %q", code, stderr, stdout, want)
	}
}

// The node ID restore gives is the one serve derives from the same flags,
// so that the printed command starts the node the data dir holds.
func TestRestoreNamesTheNodeAsServeWould(t *testing.T) {
	tests := []struct {
		name string
		args []string
		id   string
		cmd  string
	}{
		{"by default, the peer listen address",
			nil, "127.0.0.1:7481", "--peer-listen 127.0.0.1:7481\n"},
		{"the advertised peer address over the one listened on",
			[]string{"--peer-listen", "0.0.0.0:7481", "--peer-advertise", "10.0.0.5:7481"}, "10.0.0.5:7481", "--peer-listen 0.0.0.0:7481 --peer-advertise 10.0.0.5:7481\n"},
		{"a node ID given",
			[]string{"--node-id", "node 1"}, "node 1", "--peer-listen 127.0.0.1:7481 --node-id 'node 1'\n"},
	}
	snap := filepath.Join(t.TempDir(), "empty.snap")
	f, err := os.Create(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := statemachine.New().Snapshot(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := t.TempDir()
			stdout, stderr, code := runMain(append([]string{"snapshot", "restore", snap, "--data-dir", data}, tt.args...)...)
			if code != ExitOK {
				t.Fatalf("exit code got = %d, expected: 0 (stderr %q)", code, stderr)
			}
			if !strings.Contains(stdout, " as node "+tt.id+", ") || !strings.HasSuffix(stdout, tt.cmd) {
				t.Errorf("got = %q, expected: node %s and a serve command ending %q", stdout, tt.id, tt.cmd)
			}
			if got := serveNodeID(flagValue(tt.args, "--node-id"), flagValueOr(tt.args, "--peer-listen", "127.0.0.1:7481"), flagValue(tt.args, "--peer-advertise")); got != tt.id {
				t.Errorf("serve's node ID for the same flags: got = %q, expected: %q", got, tt.id)
			}
		})
	}
}

func flagValue(args []string, name string) string { return flagValueOr(args, name, "") }

func flagValueOr(args []string, name, def string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return def
}

// A failed write leaves the file as it was and no temporary file behind.
func TestWriteFileAtomicKeepsTheOldFileOnFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	_, err := writeFileAtomic(path, func(w io.Writer) error {
		w.Write([]byte("half of the new"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got = %v, expected: the writer's error", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("file got = %q, expected: %q", b, "old")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("files got = %v, expected: only f", entries)
	}
	n, err := writeFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write([]byte("new"))
		return err
	})
	if b, _ := os.ReadFile(path); err != nil || n != 3 || string(b) != "new" {
		t.Errorf("got = %q, %d bytes, %v, expected: %q, 3 bytes", b, n, err, "new")
	}
}

// Restore reads what etcdctl snapshot save writes against Tenure's etcd
// API, checks its sha256, and refuses it damaged, and refuses an etcd
// database, naming it.
func TestRestoreReadsWhatEtcdctlSaves(t *testing.T) {
	m := statemachine.New()
	m.Apply(1, statemachine.SetVersion{Version: statemachine.Version})
	var state strings.Builder
	if err := m.Snapshot(&state); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	saved := filepath.Join(dir, "etcdctl.db")
	wrapped := etcdapi.WrapSnapshot([]byte(state.String()))
	if err := os.WriteFile(saved, wrapped, 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runMain("snapshot", "restore", saved, "--data-dir", filepath.Join(dir, "a"))
	if code != ExitOK || !strings.Contains(stdout, "restored revision 0 from "+saved) {
		t.Errorf("restore of etcdctl's file: got = exit %d, %q, %q, expected: exit 0, revision 0 restored", code, stdout, stderr)
	}
	wrapped[40] ^= 1
	if err := os.WriteFile(saved, wrapped, 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = runMain("snapshot", "restore", saved, "--data-dir", filepath.Join(dir, "b"))
	if code == ExitOK || !strings.Contains(stderr, "sha256 does not match") {
		t.Errorf("restore of a damaged file: got = exit %d, %q, expected: refused for its sha256", code, stderr)
	}
	bolt := make([]byte, 8192)
	copy(bolt[16:], []byte{0xed, 0xda, 0x0c, 0xed})
	if err := os.WriteFile(saved, bolt, 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = runMain("snapshot", "restore", saved, "--data-dir", filepath.Join(dir, "c"))
	if code == ExitOK || !strings.Contains(stderr, "an etcd database (bbolt)") {
		t.Errorf("restore of an etcd database: got = exit %d, %q, expected: refused, naming it", code, stderr)
	}
}

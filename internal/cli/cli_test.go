package cli

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testnet"
)

// runMain runs the command line in process, as the binary would.
func runMain(args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	code = Main(args, strings.NewReader(""), &out, &errOut)
	return out.String(), errOut.String(), code
}

// deadEndpoint is a 127.0.0.1 address that was free a moment ago, so
// that nothing answers there.
func deadEndpoint(t *testing.T) string {
	t.Helper()
	return testnet.Free(t)
}

// Every case here fails before any request is sent: --endpoints points
// at a dead address, so a case that reached the network would exit 3
// instead of the expected code.
func TestMainExitCodesWithoutServer(t *testing.T) {
	dead := deadEndpoint(t)
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string // a part of stderr
	}{
		{"lock without a name is a usage error",
			[]string{"lock"}, ExitUsage, "tenure lock: missing NAME\nUsage: tenure lock NAME [-- CMD [ARGS...]] [flags]\nSee 'tenure lock --help'."},
		{"lock with a second name instead of -- is a usage error",
			[]string{"lock", "a", "b"}, ExitUsage, "lock takes one NAME; put the command after --"},
		{"a kill-grace of a quarter of the TTL is a usage error: the command could outlive the grant",
			[]string{"lock", "--ttl", "4s", "--kill-grace", "1s", "a", "--", "true"}, ExitUsage, "--kill-grace 1s must be under 1s (a quarter of --ttl 4s)"},
		{"a kill-grace given that is too long for a short TTL is a usage error",
			[]string{"lock", "--ttl", "2s", "--kill-grace", "2s", "a", "--", "true"}, ExitUsage, "--kill-grace 2s must be under 500ms"},
		{"a zero TTL is a usage error",
			[]string{"lock", "--ttl", "0s", "a", "--", "true"}, ExitUsage, "--ttl 0s must be positive"},
		{"a zero kill-grace is a usage error",
			[]string{"lock", "--kill-grace", "0s", "a", "--", "true"}, ExitUsage, "--kill-grace 0s must be positive"},
		{"a capacity under 1 is a usage error",
			[]string{"lock", "--capacity", "0", "a", "--", "true"}, ExitUsage, "--capacity 0 must be at least 1"},
		{"an unknown flag is a usage error that points at --help",
			[]string{"lock", "--bogus", "a"}, ExitUsage, "unknown flag: --bogus\nSee 'tenure lock --help'."},
		{"an unknown command is a usage error",
			[]string{"frobnicate"}, ExitUsage, `unknown command "frobnicate"`},
		{"elect without a command, --observe or --leader is a usage error",
			[]string{"elect", "e"}, ExitUsage, "elect needs a command after --"},
		{"elect with two names is a usage error",
			[]string{"elect", "e", "f"}, ExitUsage, "elect takes one NAME"},
		{"elect --observe takes no command",
			[]string{"elect", "e", "--observe", "--", "true"}, ExitUsage, "--observe and --leader take no command"},
		{"elect --observe and --leader exclude each other",
			[]string{"elect", "e", "--observe", "--leader"}, ExitUsage, "[observe leader]"},
		{"elect checks the kill-grace too",
			[]string{"elect", "--ttl", "4s", "--kill-grace", "2s", "e", "--", "true"}, ExitUsage, "must be under 1s"},
		{"validate needs --token",
			[]string{"validate", "x"}, ExitUsage, `required flag(s) "token" not set`},
		{"validate needs a positive token",
			[]string{"validate", "x", "--token", "0"}, ExitUsage, "--token must be a positive fencing token"},
		{"elect without a name names what is missing",
			[]string{"elect"}, ExitUsage, "tenure elect: missing NAME\nUsage: tenure elect NAME [-- CMD [ARGS...]] [flags]"},
		{"validate without a name names what is missing, not the flag's value",
			[]string{"validate", "--token", "1"}, ExitUsage, "tenure validate: missing NAME\nUsage: tenure validate NAME --token N [flags]"},
		{"certs client without a name names it",
			[]string{"certs", "client", "d"}, ExitUsage, "tenure certs client: missing NAME\nUsage:"},
		{"kv put with nothing names both",
			[]string{"kv", "put"}, ExitUsage, "tenure kv put: missing KEY and VALUE"},
		{"revoke needs a name",
			[]string{"revoke"}, ExitUsage, "tenure revoke: missing NAME\nUsage: tenure revoke NAME [flags]"},
		{"kv watch needs a key or a prefix",
			[]string{"kv", "watch"}, ExitUsage, "give either KEY or --prefix PREFIX"},
		{"kv watch takes a key or a prefix, not both",
			[]string{"kv", "watch", "k", "--prefix", "p"}, ExitUsage, "give either KEY or --prefix PREFIX"},
		{"kv set compares a value or a revision, not both",
			[]string{"kv", "set", "k", "v", "--swap-with-value", "a", "--swap-with-revision", "3"}, ExitUsage, "[swap-with-value swap-with-revision]"},
		{"kv set rejects a negative revision",
			[]string{"kv", "set", "k", "v", "--swap-with-revision", "-1"}, ExitUsage, "--swap-with-revision -1 must not be negative"},
		{"a zero TTL on a key is a usage error",
			[]string{"kv", "put", "k", "v", "--ttl", "0"}, ExitUsage, `TTL "0" must be positive`},
		{"a TTL that is neither seconds nor a duration is a usage error",
			[]string{"kv", "mk", "k", "v", "--ttl", "soon"}, ExitUsage, `TTL "soon": give seconds (10) or a duration (10s)`},
		{"kv put takes a key and a value",
			[]string{"kv", "put", "k"}, ExitUsage, "tenure kv put: missing VALUE\nUsage: tenure kv put KEY VALUE [flags]"},
		{"serve rejects an unknown log level before listening",
			[]string{"serve", "--log-level", "loud"}, ExitUsage, `--log-level "loud"`},
		{"serve rejects a min TTL of zero",
			[]string{"serve", "--min-ttl", "0s"}, ExitUsage, "MinTTL is 0s; it must be positive (--min-ttl)"},
		{"serve rejects an unknown log store",
			[]string{"serve", "--log-store", "mem"}, ExitUsage, `--log-store "mem": must be "wal" or "boltdb"`},
		{"serve rejects an election timeout too short to tick",
			[]string{"serve", "--election-timeout", "5ms"}, ExitUsage, "--election-timeout 5ms: must be at least 10ms"},
		{"serve rejects a storage quota the watch history alone would fill",
			[]string{"serve", "--quota-backend-bytes", "1MiB"}, ExitUsage, "--quota-backend-bytes 1MiB: must be at least 32MiB, or 0 for the default 2GiB"},
		{"serve rejects a storage quota that is not a size",
			[]string{"serve", "--quota-backend-bytes", "lots"}, ExitUsage, `"lots" is not a size`},
		{"a mistyped get subcommand is a usage error",
			[]string{"get", "leasez"}, ExitUsage, `unknown command "leasez" for "tenure get"`},
		{"a mistyped kv subcommand is a usage error",
			[]string{"kv", "gett", "k"}, ExitUsage, `unknown command "gett" for "tenure kv"`},
		{"get leases takes at most one name",
			[]string{"get", "leases", "a", "b"}, ExitUsage, "tenure get leases: too many arguments (2)\nUsage: tenure get leases [NAME] [flags]"},
		{"members takes a known output format",
			[]string{"members", "-o", "bogus"}, ExitUsage, `-o "bogus": use table, wide, json or yaml`},
		{"a mistyped members subcommand is a usage error",
			[]string{"members", "remvoe", "x"}, ExitUsage, `unknown command "remvoe" for "tenure members"`},
		{"members remove needs an ID",
			[]string{"members", "remove"}, ExitUsage, "remove takes the ID of one member (tenure members lists them), got 0 arguments"},
		{"members remove refuses an empty ID",
			[]string{"members", "remove", ""}, ExitUsage, "member ID is empty"},
		{"members transfer-leadership takes at most one ID",
			[]string{"members", "transfer-leadership", "a", "b"}, ExitUsage, "transfer-leadership takes at most one member ID, got 2"},
		{"snapshot needs a subcommand",
			[]string{"snapshot"}, ExitUsage, "snapshot needs a subcommand: save or restore"},
		{"snapshot save needs a file",
			[]string{"snapshot", "save"}, ExitUsage, "save takes the FILE to write, got 0 arguments"},
		{"snapshot save refuses a directory",
			[]string{"snapshot", "save", "."}, ExitUsage, ". is a directory: give a file name"},
		{"snapshot restore needs --data-dir",
			[]string{"snapshot", "restore", "f.snap"}, ExitUsage, `required flag(s) "data-dir" not set`},
		{"snapshot restore needs a file",
			[]string{"snapshot", "restore", "--data-dir", "d"}, ExitUsage, "restore takes the FILE to read, got 0 arguments"},
		{"snapshot restore refuses an unknown log store",
			[]string{"snapshot", "restore", "f.snap", "--data-dir", "d", "--log-store", "mem"}, ExitUsage, `--log-store "mem": must be "wal" or "boltdb"`},
		{"snapshot restore refuses a peer address that is not host:port",
			[]string{"snapshot", "restore", "f.snap", "--data-dir", "d", "--peer-listen", "7481"}, ExitUsage, `--peer-listen "7481": want host:port`},
		{"snapshot restore refuses to put every interface in the cluster's configuration",
			[]string{"snapshot", "restore", "f.snap", "--data-dir", "d", "--peer-listen", "0.0.0.0:7481"}, ExitUsage, "--peer-listen 0.0.0.0:7481 is every interface, not an address other nodes can dial: give the one they reach this node at with --peer-advertise"},
		{"snapshot restore names a file that is not there",
			[]string{"snapshot", "restore", "no-such.snap", "--data-dir", "d"}, ExitUsage, "snapshot file: open no-such.snap: no such file or directory"},
		{"dev needs a subcommand",
			[]string{"dev"}, ExitUsage, "dev needs a subcommand: cluster"},
		{"dev cluster needs a node",
			[]string{"dev", "cluster", "--nodes", "0"}, ExitUsage, "--nodes 0: give 1 to 9"},
		{"dev cluster takes API and peer ports together",
			[]string{"dev", "cluster", "--api-ports", "1,2"}, ExitUsage, "[api-ports peer-ports]"},
		{"dev cluster takes a port of each kind per node",
			[]string{"dev", "cluster", "--nodes", "2", "--api-ports", "1,2", "--peer-ports", "3"}, ExitUsage, "--api-ports and --peer-ports need one port per node: got 2 and 1 for 2 nodes"},
		{"dev cluster refuses a port given twice",
			[]string{"dev", "cluster", "--api-ports", "1,2", "--peer-ports", "3,2"}, ExitUsage, "port 2 is given twice"},
		{"dev cluster keeps its ports in range",
			[]string{"dev", "cluster", "--base-port", "65530"}, ExitUsage, "--base-port 65530: the ports of 3 nodes must lie in 1 to 65535"},
		{"dev cluster takes a known log level",
			[]string{"dev", "cluster", "--log-level", "loud"}, ExitUsage, `--log-level "loud": use debug, info, warn or error`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--endpoints", dead}, tt.args...)
			stdout, stderr, code := runMain(args...)
			if code != tt.code {
				t.Errorf("tenure %s: exit code got = %d, expected: %d (stderr %q)", strings.Join(tt.args, " "), code, tt.code, stderr)
			}
			if !strings.HasPrefix(stderr, "Error: ") || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("tenure %s: stderr got = %q, expected: \"Error: ...%s...\"", strings.Join(tt.args, " "), stderr, tt.stderr)
			}
			if stdout != "" {
				t.Errorf("tenure %s: stdout got = %q, expected: nothing", strings.Join(tt.args, " "), stdout)
			}
		})
	}
}

func TestMainEmptyEndpointsIsUsageError(t *testing.T) {
	_, stderr, code := runMain("--endpoints", " , ", "kv", "get", "k")
	if code != ExitUsage || stderr != "Error: --endpoints is empty\n" {
		t.Errorf("got = exit %d, stderr %q, expected: exit %d, \"Error: --endpoints is empty\\n\"", code, stderr, ExitUsage)
	}
}

func TestMainUnreachableExits3(t *testing.T) {
	dead := deadEndpoint(t)
	for _, args := range [][]string{
		{"kv", "get", "k"},
		{"kv", "set", "k", "v", "--swap-with-value", "x"},
		{"get", "leases", "-A"},
		{"get", "sessions"},
		{"validate", "x", "--token", "3"},
		{"revoke", "x"},
		{"elect", "e", "--leader"},
		{"lock", "x", "--", "true"},
		{"elect", "e", "--", "true"},
	} {
		_, stderr, code := runMain(append([]string{"--endpoints", dead, "--timeout", "2s"}, args...)...)
		if code != ExitUnreachable {
			t.Errorf("tenure %s against a dead server: exit code got = %d, expected: %d (stderr %q)", strings.Join(args, " "), code, ExitUnreachable, stderr)
		}
		if !strings.HasPrefix(stderr, "Error: ") {
			t.Errorf("tenure %s against a dead server: stderr got = %q, expected: an Error: line", strings.Join(args, " "), stderr)
		}
	}
}

// A server that cuts every connection gives no answer: the error says
// what tenure was doing, in words, and no RPC name (it used to print
// "ListLeases: unexpected EOF").
func TestMainCutConnectionSaysWhatItWasDoing(t *testing.T) {
	ln := testnet.Listen(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Read the whole request first, so that the client is
			// waiting for an answer when the connection goes.
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				_, _ = io.Copy(io.Discard, req.Body)
			}
			c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	for _, tt := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"get", "leases"}, "Error: list leases: unexpected EOF\n"},
		{[]string{"get", "sessions"}, "Error: list sessions: unexpected EOF\n"},
	} {
		_, stderr, code := runMain(append([]string{"--endpoints", ln.Addr().String(), "--timeout", "2s"}, tt.args...)...)
		if code != ExitUnreachable || stderr != tt.stderr {
			t.Errorf("tenure %s: got = exit %d, %q, expected: exit %d, %q", strings.Join(tt.args, " "), code, stderr, ExitUnreachable, tt.stderr)
		}
	}
}

// walk calls fn for cmd and every command below it.
func walk(cmd *cobra.Command, fn func(*cobra.Command)) {
	fn(cmd)
	for _, c := range cmd.Commands() {
		walk(c, fn)
	}
}

func TestEveryCommandHasHelpWithExamples(t *testing.T) {
	var paths [][]string
	walk(NewRootCommand(), func(c *cobra.Command) {
		if c.Example == "" {
			t.Errorf("%q: Example got = empty, expected: examples for --help", c.CommandPath())
		}
		if c.Short == "" {
			t.Errorf("%q: Short got = empty, expected: a one-line summary", c.CommandPath())
		}
		paths = append(paths, strings.Fields(c.CommandPath())[1:])
	})
	if len(paths) < 18 {
		t.Fatalf("commands found: got = %d, expected: at least 18 (%v)", len(paths), paths)
	}
	for _, p := range paths {
		stdout, stderr, code := runMain(append(p, "--help")...)
		name := strings.Join(append([]string{"tenure"}, p...), " ")
		if code != ExitOK || stderr != "" {
			t.Errorf("%s --help: got = exit %d, stderr %q, expected: exit 0 and no stderr", name, code, stderr)
		}
		for _, want := range []string{"Usage:", "Examples:", "tenure"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("%s --help: got = %q, expected: it to contain %q", name, stdout, want)
			}
		}
	}
}

func TestCommandsAreGrouped(t *testing.T) {
	want := map[string]string{
		"lock": "run", "elect": "run", "heartbeat": "run",
		"get": "inspect", "validate": "inspect", "validate-key": "inspect", "etcd": "keys", "revoke": "inspect", "lease": "inspect", "watch": "inspect",
		"kv": "keys", "serve": "server", "members": "server", "snapshot": "server", "dev": "server", "bench": "server", "certs": "server",
		"auth": "server",
	}
	root := NewRootCommand()
	for _, c := range root.Commands() {
		if got := c.GroupID; got != want[c.Name()] {
			t.Errorf("%s: group got = %q, expected: %q", c.Name(), got, want[c.Name()])
		}
		delete(want, c.Name())
	}
	if len(want) != 0 {
		t.Errorf("commands missing from the root: %v", want)
	}
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		stdout, stderr, code := runMain("completion", shell)
		if code != ExitOK || stderr != "" || !strings.Contains(stdout, "tenure") {
			t.Errorf("completion %s: got = exit %d, stderr %q, %d bytes, expected: exit 0 and a script", shell, code, stderr, len(stdout))
		}
	}
}

func TestTTLFlag(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"10", 10 * time.Second, false},
		{"1", time.Second, false},
		{"10s", 10 * time.Second, false},
		{"1m30s", 90 * time.Second, false},
		{"1500ms", 1500 * time.Millisecond, false},
		{"0", 0, true},
		{"-5", 0, true},
		{"0s", 0, true},
		{"-1s", 0, true},
		{"ten", 0, true},
		{"", 0, true},
	} {
		var f ttlFlag
		err := f.Set(tt.in)
		if (err != nil) != tt.err || f.d != tt.want {
			t.Errorf("--ttl %q: got = %v, err %v, expected: %v, error %v", tt.in, f.d, err, tt.want, tt.err)
		}
	}
	var f ttlFlag
	if f.String() != "" || f.opts() != nil {
		t.Errorf("unset --ttl: got = %q with %d options, expected: empty and none", f.String(), len(f.opts()))
	}
	_ = f.Set("10")
	if f.String() != "10s" || len(f.opts()) != 1 {
		t.Errorf("--ttl 10: got = %q with %d options, expected: \"10s\" and one", f.String(), len(f.opts()))
	}
}

// The kill-grace and lock-delay a user leaves out follow --ttl, so that
// any TTL works without them; a value given is checked, never adjusted.
func TestGrantOptionsCheck(t *testing.T) {
	tests := []struct {
		name          string
		args          []string
		wantErr       string
		wantKillGrace time.Duration
		wantLockDelay time.Duration
	}{
		{"the defaults are a 2s kill-grace and a 3s lock-delay for the default TTL of 10s",
			nil, "", 2 * time.Second, 3 * time.Second},
		{"a 5s TTL gets a kill-grace of a fifth of it",
			[]string{"--ttl", "5s"}, "", time.Second, 2 * time.Second},
		{"the server's minimum TTL of 2s gets 400ms, under its quarter of 500ms",
			[]string{"--ttl", "2s"}, "", 400 * time.Millisecond, 1400 * time.Millisecond},
		{"a long TTL keeps the kill-grace at 2s",
			[]string{"--ttl", "1m"}, "", 2 * time.Second, 3 * time.Second},
		{"a kill-grace given is kept, and the lock-delay follows it",
			[]string{"--ttl", "4s", "--kill-grace", "999ms"}, "", 999 * time.Millisecond, 1999 * time.Millisecond},
		{"a lock-delay given is kept",
			[]string{"--ttl", "4s", "--lock-delay", "10s"}, "", 800 * time.Millisecond, 10 * time.Second},
		{"a lock-delay of zero given stays zero",
			[]string{"--ttl", "4s", "--kill-grace", "500ms", "--lock-delay", "0"}, "", 500 * time.Millisecond, 0},
		{"a kill-grace given of exactly a quarter of the TTL fails",
			[]string{"--ttl", "4s", "--kill-grace", "1s"}, "--kill-grace 1s must be under 1s (a quarter of --ttl 4s)", 0, 0},
		{"a kill-grace given that fits the default TTL but not a short one fails",
			[]string{"--ttl", "2s", "--kill-grace", "2s"}, "--kill-grace 2s must be under 500ms (a quarter of --ttl 2s)", 0, 0},
		{"a kill-grace given of zero fails",
			[]string{"--kill-grace", "0s"}, "--kill-grace 0s must be positive", 0, 0},
		{"a negative kill-grace fails",
			[]string{"--kill-grace", "-1s"}, "--kill-grace -1s must be positive", 0, 0},
		{"a negative lock-delay fails",
			[]string{"--lock-delay", "-1s"}, "--lock-delay -1s must not be negative", 0, 0},
		{"a negative TTL fails",
			[]string{"--ttl", "-1s"}, "--ttl -1s must be positive", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o grantOptions
			cmd := &cobra.Command{}
			addGrantFlags(cmd, &o)
			if err := cmd.ParseFlags(tt.args); err != nil {
				t.Fatal(err)
			}
			err := o.check(cmd)
			if tt.wantErr != "" {
				var ee *exitError
				if !errors.As(err, &ee) || ee.code != ExitUsage || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("got = %v, expected: a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got = %v, expected: no error", err)
			}
			if o.killGrace != tt.wantKillGrace || o.lockDelay != tt.wantLockDelay {
				t.Errorf("kill-grace, lock-delay: got = %v, %v, expected: %v, %v", o.killGrace, o.lockDelay, tt.wantKillGrace, tt.wantLockDelay)
			}
		})
	}
}

func TestCompareFailedMessages(t *testing.T) {
	cur := client.KeyValue{Key: "my-lock", Value: "alice", ModRevision: 2}
	tests := []struct {
		name    string
		cf      *client.CompareFailedError
		byValue bool
		want    string
		wantRev int64
		msg     string
	}{
		{"a value compare names the expected and the actual value, as etcdctl does",
			&client.CompareFailedError{Current: cur, Found: true, Revision: 2}, true, "unlocked", 0,
			"compare failed ([unlocked != alice]) [2]"},
		{"a revision compare names the expected and the actual revision",
			&client.CompareFailedError{Current: cur, Found: true, Revision: 5}, false, "", 1,
			"compare failed ([1 != 2]) [5]"},
		{"a value compare on a missing key says it is not found",
			&client.CompareFailedError{Found: false, Revision: 7}, true, "unlocked", 0,
			"key not found (my-lock) [7]"},
		{"a revision compare on a missing key says it is not found",
			&client.CompareFailedError{Found: false, Revision: 7}, false, "", 3,
			"key not found (my-lock) [7]"},
	}
	for _, tt := range tests {
		if got := compareFailed("my-lock", tt.cf, tt.byValue, tt.want, tt.wantRev).Error(); got != tt.msg {
			t.Errorf("%s: got = %q, expected: %q", tt.name, got, tt.msg)
		}
	}
}

func TestGrantEnv(t *testing.T) {
	got := grantEnv(client.Token{Namespace: "prod", Name: "report", Token: 42}, "host_1_ab", "a:1,b:2")
	want := []string{"TENURE_LEASE=prod/report", "TENURE_FENCING_TOKEN=42", "TENURE_HOLDER=host_1_ab", "TENURE_ENDPOINTS=a:1,b:2"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got = %q, expected: %q", got, want)
	}
}

func TestExitErrorMessages(t *testing.T) {
	if got := (&exitError{code: 7}).Error(); got != "exit status 7" {
		t.Errorf("quiet exit: got = %q, expected: \"exit status 7\"", got)
	}
	inner := errors.New("boom")
	e := &exitError{code: ExitUnmet, err: inner}
	if e.Error() != "boom" || !errors.Is(e, inner) {
		t.Errorf("wrapped exit: got = %q, unwraps %v, expected: \"boom\" that unwraps", e.Error(), errors.Is(e, inner))
	}
	if !errors.As(unreachable(&client.Error{Op: "Get", Kind: client.ErrUnavailable, Cause: inner}), &e) || e.code != ExitUnreachable {
		t.Errorf("unreachable(ErrUnavailable): got = %v, expected: exit %d", e, ExitUnreachable)
	}
	if err := unreachable(inner); err != inner {
		t.Errorf("unreachable(other): got = %v, expected: unchanged", err)
	}
}

func TestLostCodeIsNeverZero(t *testing.T) {
	for _, tt := range []struct{ in, want int }{{0, ExitUnmet}, {3, 3}, {143, 143}, {137, 137}} {
		if got := lostCode(tt.in); got != tt.want {
			t.Errorf("lostCode(%d): got = %d, expected: %d", tt.in, got, tt.want)
		}
	}
}

func TestGrantFlagsHelpShowTheirDefaults(t *testing.T) {
	for _, cmd := range []string{"lock", "elect"} {
		stdout, _, _ := runMain(cmd, "--help")
		for _, want := range []string{"(default --ttl/5, at most 2s)", "(default --kill-grace + 1s)"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("%s --help: got = %q, expected: %q, the rule rather than a value", cmd, stdout, want)
			}
		}
	}
}

func TestGroupCommandsWithoutSubcommandPrintHelp(t *testing.T) {
	for _, cmd := range []string{"get", "kv"} {
		stdout, stderr, code := runMain(cmd)
		if code != ExitOK || stderr != "" || !strings.Contains(stdout, "Available Commands:") {
			t.Errorf("tenure %s: got = exit %d, stderr %q, stdout %q, expected: exit 0 and its help", cmd, code, stderr, stdout)
		}
	}
}

// TestServeChecksAddressesFirst: an address without a port, or with one
// that is no port, is a usage error (2) saying so, not advice to add TLS
// (the host cannot be judged without a port) nor a failed listen (3).
func TestServeChecksAddressesFirst(t *testing.T) {
	dataDir := t.TempDir()
	for _, tt := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"--listen", "127.0.0.1"}, `Error: --listen "127.0.0.1": want host:port, e.g. 127.0.0.1:7480 (address 127.0.0.1: missing port in address)`},
		{[]string{"--listen", "127.0.0.1:99999"}, `Error: --listen "127.0.0.1:99999": port "99999" is not a number from 0 to 65535`},
		{[]string{"--peer-listen", "localhost"}, `Error: --peer-listen "localhost": want host:port, e.g. 127.0.0.1:7481`},
		{[]string{"--advertise", "10.0.0.5"}, `Error: --advertise "10.0.0.5": want host:port, e.g. 10.0.0.5:7480`},
	} {
		args := append([]string{"serve", "--data-dir", dataDir}, tt.args...)
		_, stderr, code := runMain(args...)
		if code != ExitUsage || !strings.HasPrefix(stderr, tt.stderr) {
			t.Errorf("tenure %s: got = exit %d, %q, expected: exit %d and %q", strings.Join(args, " "), code, stderr, ExitUsage, tt.stderr)
		}
	}
}

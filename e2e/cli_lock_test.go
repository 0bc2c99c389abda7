//go:build linux

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tenurehq/tenure/internal/testnet"
)

// --- mutual exclusion ---

// TestCLILockExcludes runs two `tenure lock` loops on one lock at once.
// Each command appends start and end marks with its fencing token to one
// file and sleeps between them: the marks never interleave, and the
// tokens strictly increase from one command to the next.
func TestCLILockExcludes(t *testing.T) {
	e := newCLIEnv(t)
	const workers, iterations = 2, 4
	script := `echo start $TENURE_FENCING_TOKEN >> marks; sleep 0.2; echo end $TENURE_FENCING_TOKEN >> marks`
	began := time.Now()
	var wg sync.WaitGroup
	results := make([][]result, workers)
	for w := range workers {
		wg.Go(func() {
			for range iterations {
				p := e.start("lock", "--identity", fmt.Sprintf("worker-%d", w), "excl", "--", "sh", "-c", script)
				select {
				case <-p.done:
				case <-time.After(15 * time.Second):
				}
				results[w] = append(results[w], result{p.stdout.String(), p.stderr.String(), p.code})
				if !p.exited() {
					return // reported below; cleanup kills it
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	for w, rs := range results {
		if len(rs) != iterations {
			t.Fatalf("worker %d: got = %d runs, expected: %d (one did not finish within 15s)", w, len(rs), iterations)
		}
		for i, r := range rs {
			if r.code != 0 || r.stdout != "" || r.stderr != "" {
				t.Errorf("worker %d run %d: got = %v, expected: exit 0 and no output", w, i, r)
			}
		}
	}
	b, err := os.ReadFile(e.path("marks"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 2*workers*iterations {
		t.Fatalf("marks: got = %d lines, expected: %d:\n%s", len(lines), 2*workers*iterations, b)
	}
	var last int64
	for i := 0; i < len(lines); i += 2 {
		start, end := lines[i], lines[i+1]
		tok, err := strconv.ParseInt(strings.TrimPrefix(start, "start "), 10, 64)
		if err != nil || !strings.HasPrefix(start, "start ") || end != "end "+strconv.FormatInt(tok, 10) {
			t.Fatalf("marks %d-%d: got = %q, %q, expected: start N then end N, never interleaved:\n%s", i+1, i+2, start, end, b)
		}
		if tok <= last {
			t.Errorf("fencing token of run %d: got = %d, expected: above %d, the previous run's", i/2+1, tok, last)
		}
		last = tok
	}
	// Serialized critical sections take at least their sum.
	if least := time.Duration(workers*iterations) * 200 * time.Millisecond; took < least {
		t.Errorf("%d runs took %v, expected: at least %v if they ran one at a time", workers*iterations, took, least)
	}
	t.Logf("%d runs in %v; tokens up to %d", workers*iterations, took.Round(time.Millisecond), last)
}

// --- losing the lock ---

// TestCLILockRevokeStopsGroupFirst holds a lock with a command whose
// process group (a shell and a grandchild) ignores SIGTERM, queues a
// second `tenure lock`, and revokes the first grant. The first tenure
// must kill the whole group (SIGKILL after --kill-grace) before the
// second is granted, which the lease's lock-delay (--kill-grace + 1s by
// default) holds back.
func TestCLILockRevokeStopsGroupFirst(t *testing.T) {
	e := newCLIEnv(t)
	first := e.start("lock", "--identity", "first", "--kill-grace", "500ms", "revoked", "--", "sh", "-c", holdingScript(true))
	group := e.watchGroup("pids")
	second := e.start("lock", "--identity", "second", "revoked", "--", "sh", "-c", `date +%s.%N > granted`)
	e.waitWaiter("revoked", "second")
	token := e.lease("revoked").Status.FencingToken

	e.expect(0, fmt.Sprintf("revoked default/revoked token %d\n", token), "", "revoke", "revoked", "--reason", "e2e: wedged")
	goneAt := group.wait(t, 5*time.Second)
	if code := second.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("second tenure lock: exit code got = %d, expected: 0 (stderr %q)", code, second.stderr)
	}
	granted := readUnixTime(t, e.waitFile("granted", time.Second))
	code := first.wait(t, 10*time.Second)
	wantErr := fmt.Sprintf("Error: lost default/revoked (token %d) while the command ran; it was stopped:", token)
	if code == 0 || !strings.HasPrefix(first.stderr.String(), wantErr) {
		t.Errorf("first tenure lock: got = exit %d, stderr %q, expected: non-zero and %q...", code, first.stderr, wantErr)
	}

	evs := e.events("revoked", func(evs []leaseEvent) bool {
		_, ok := findEvent(evs, "acquired", "second")
		return ok
	})
	revoked, ok := findEvent(evs, "revoked", "first")
	if !ok || revoked.Token != token || revoked.Reason != "e2e: wedged" {
		t.Fatalf("events: got = %+v, expected: token %d revoked with the reason", evs, token)
	}
	acquired, _ := findEvent(evs, "acquired", "second")
	if !goneAt.Before(acquired.Time) || !goneAt.Before(granted) {
		t.Errorf("first's process group gone at %v, expected: before the second grant at %v (its command started at %v)",
			goneAt.Format(time.StampMicro), acquired.Time.Format(time.StampMicro), granted.Format(time.StampMicro))
	}
	if d := acquired.Time.Sub(revoked.Time); d < 1500*time.Millisecond {
		t.Errorf("second granted %v after the revoke, expected: at least the lock-delay of 1.5s (--kill-grace 500ms + 1s)", d)
	}
	if acquired.Token <= token {
		t.Errorf("second token: got = %d, expected: above %d", acquired.Token, token)
	}
	t.Logf("revoked at %s; group gone %v later; second granted %v after the group was gone",
		revoked.Time.Format(time.StampMilli), goneAt.Sub(revoked.Time).Round(time.Millisecond), acquired.Time.Sub(goneAt).Round(time.Millisecond))
}

// TestCLILockHeartbeatLossStopsGroupFirst runs `tenure lock --ttl 4s
// --kill-grace 500ms --lock-delay 0` through a TCP proxy, then makes the
// proxy stop forwarding: the CLI's heartbeats go unanswered, and the
// server expires the session a TTL after the last one it saw. With no
// lock-delay to hide behind, the CLI must stop the whole group (which
// ignores SIGTERM) by 0.75×TTL + kill-grace, before the server can expire
// the session and grant the queued second tenure.
func TestCLILockHeartbeatLossStopsGroupFirst(t *testing.T) {
	e := newCLIEnv(t)
	px := newProxy(t, e.srv.listen)
	first := e.startAt(px.addr(), "lock", "--identity", "partitioned", "--ttl", "4s", "--kill-grace", "500ms", "--lock-delay", "0",
		"partition", "--", "sh", "-c", holdingScript(true))
	group := e.watchGroup("pids")
	second := e.start("lock", "--identity", "second", "partition", "--", "sh", "-c", `date +%s.%N > granted`)
	e.waitWaiter("partition", "second")
	token := e.lease("partition").Status.FencingToken

	pausedAt := time.Now()
	px.pause()
	goneAt := group.wait(t, 8*time.Second)
	px.cut() // let the first tenure's last calls fail fast
	if code := second.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("second tenure lock: exit code got = %d, expected: 0 (stderr %q)", code, second.stderr)
	}
	granted := readUnixTime(t, e.waitFile("granted", time.Second))
	code := first.wait(t, 10*time.Second)
	wantErr := fmt.Sprintf("Error: lost default/partition (token %d) while the command ran; it was stopped:", token)
	if code == 0 || !strings.HasPrefix(first.stderr.String(), wantErr) {
		t.Errorf("first tenure lock: got = exit %d, stderr %q, expected: non-zero and %q...", code, first.stderr, wantErr)
	}

	evs := e.events("partition", func(evs []leaseEvent) bool {
		_, ok := findEvent(evs, "acquired", "second")
		return ok
	})
	if ev, ok := findEvent(evs, "expired", "partitioned"); !ok || ev.Token != token {
		t.Errorf("events: got = %+v, expected: token %d expired", evs, token)
	}
	acquired, _ := findEvent(evs, "acquired", "second")
	if !goneAt.Before(acquired.Time) || !goneAt.Before(granted) {
		t.Errorf("first's process group gone at %v, expected: before the second grant at %v (its command started at %v)",
			goneAt.Format(time.StampMicro), acquired.Time.Format(time.StampMicro), granted.Format(time.StampMicro))
	}
	// The last heartbeat acknowledged was sent before the pause, so the
	// group is stopped by 0.75×4s + 500ms after it at the latest.
	if d := goneAt.Sub(pausedAt); d > 3500*time.Millisecond+500*time.Millisecond {
		t.Errorf("group gone %v after heartbeats stopped, expected: within 0.75×TTL + kill-grace = 3.5s (plus scheduling slack)", d)
	}
	t.Logf("heartbeats stopped; group gone %v later; second granted %v after that",
		goneAt.Sub(pausedAt).Round(time.Millisecond), acquired.Time.Sub(goneAt).Round(time.Millisecond))
}

// proxy forwards TCP connections to a server until paused. Paused, it
// keeps every connection open but forwards nothing, in either direction:
// a network partition, not a refused connection. Cut closes everything.
type proxy struct {
	ln      net.Listener
	target  string
	paused  chan struct{}
	cutC    chan struct{}
	pauseMu sync.Once
	cutMu   sync.Once
	mu      sync.Mutex // guards conns
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln := testnet.Listen(t)
	p := &proxy{ln: ln, target: target, paused: make(chan struct{}), cutC: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.cutC:
		c.Close()
		return false
	default:
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() {
			select {
			case <-p.paused:
				return // held open, never forwarded, until cut
			default:
			}
			up, err := net.DialTimeout("tcp", p.target, time.Second)
			if err != nil || !p.track(up) {
				c.Close()
				return
			}
			p.wg.Go(func() { p.copy(up, c) })
			p.copy(c, up)
		})
	}
}

// copy forwards from src to dst until either closes or the proxy is
// paused: whatever is read after the pause is dropped.
func (p *proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.paused:
			<-p.cutC
			return
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if cw, ok := dst.(*net.TCPConn); ok {
					_ = cw.CloseWrite()
				}
			}
			return
		}
	}
}

func (p *proxy) pause() { p.pauseMu.Do(func() { close(p.paused) }) }

// cut closes the listener and every connection, and waits for the
// proxy's goroutines. It is safe to call more than once.
func (p *proxy) cut() {
	p.cutMu.Do(func() {
		p.mu.Lock()
		close(p.cutC)
		conns := p.conns
		p.mu.Unlock()
		p.ln.Close()
		for _, c := range conns {
			c.Close()
		}
	})
	p.wg.Wait()
}

// --- signals and exit codes ---

func TestCLILockSignalsAndExitCodes(t *testing.T) {
	e := newCLIEnv(t)

	// A command that traps sig, writes its name to got and exits 3.
	trapping := func(sig string) string {
		return `trap "echo ` + sig + ` > got-` + sig + `; exit 3" ` + sig + `; echo ready > ready-` + sig + `; while :; do sleep 0.05; done`
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		name := strings.TrimPrefix(unix.SignalName(sig), "SIG")
		t.Run(name+" to tenure reaches the command, and tenure exits with its code", func(t *testing.T) {
			p := e.start("lock", "sig-"+name, "--", "sh", "-c", trapping(name))
			e.waitFile("ready-"+name, 10*time.Second)
			p.signal(t, sig)
			if code := p.wait(t, 10*time.Second); code != 3 {
				t.Errorf("exit code got = %d, expected: 3 from the command (stderr %q)", code, p.stderr)
			}
			if got := e.waitFile("got-"+name, time.Second); got != name {
				t.Errorf("the command's trap: got = %q, expected: %q", got, name)
			}
			// The lock was released on the way out.
			e.expect(0, "", "", "lock", "--try", "sig-"+name, "--", "true")
		})
	}

	t.Run("the command's exit code is tenure's", func(t *testing.T) {
		e.expect(7, "out\n", "err\n", "lock", "code", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		e.expect(0, "", "", "lock", "code", "--", "true")
	})

	t.Run("a command that cannot start exits 127", func(t *testing.T) {
		e.expect(127, "", "Error: start ./no-such-command: no such file or directory\n", "lock", "nocmd", "--", "./no-such-command")
	})

	t.Run("--try on a held lock exits 1, and so does running out of --wait", func(t *testing.T) {
		holder := e.start("lock", "--identity", "holder", "held", "--", "sh", "-c", `echo ready > ready-held; sleep 30`)
		e.waitFile("ready-held", 10*time.Second)
		e.expect(1, "", "Error: default/held is held by \"holder\"\n", "lock", "--try", "held", "--", "sh", "-c", "echo ran > ran-held")
		e.expect(1, "", "Error: gave up waiting for default/held after 300ms\n", "lock", "--wait", "300ms", "held", "--", "sh", "-c", "echo ran > ran-held")
		if e.exists("ran-held") {
			t.Errorf("the command of a lock not acquired ran")
		}
		holder.signal(t, syscall.SIGTERM)
		if code := holder.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
			t.Errorf("holder after SIGTERM: exit code got = %d, expected: %d, its command's", code, 128+int(syscall.SIGTERM))
		}
	})

	t.Run("lock without a command holds until interrupted", func(t *testing.T) {
		p := e.start("lock", "--identity", "bare", "bare")
		var token string
		waitFor(t, 10*time.Second, "tenure lock to print its grant", func() bool {
			m := regexp.MustCompile(`^default/bare held by bare with fencing token (\d+); interrupt to release\n$`).FindStringSubmatch(p.stdout.String())
			if m != nil {
				token = m[1]
			}
			return m != nil
		})
		e.expect(0, fmt.Sprintf("valid: token %s holds default/bare (holder bare)\n", token), "", "validate", "bare", "--token", token)
		p.signal(t, syscall.SIGINT)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Errorf("exit code after SIGINT: got = %d, expected: 0 (stderr %q)", code, p.stderr)
		}
		e.expect(1, "not valid: default/bare has no holder\n", "", "validate", "bare", "--token", token)
	})

	t.Run("a loss exits non-zero even when the command exits 0 on SIGTERM", func(t *testing.T) {
		p := e.start("lock", "--identity", "graceful", "--kill-grace", "500ms", "graceful", "--", "sh", "-c",
			`trap "echo stopped > stopped; exit 0" TERM; echo ready > ready-graceful; while :; do sleep 0.05; done`)
		e.waitFile("ready-graceful", 10*time.Second)
		token := e.lease("graceful").Status.FencingToken
		e.expect(0, fmt.Sprintf("revoked default/graceful token %d\n", token), "", "revoke", "graceful")
		code := p.wait(t, 10*time.Second)
		// The shell may say "Terminated" about its sleep first.
		if code != 1 || !strings.Contains(p.stderr.String(), fmt.Sprintf("Error: lost default/graceful (token %d)", token)) {
			t.Errorf("got = exit %d, stderr %q, expected: exit 1 and the loss", code, p.stderr)
		}
		if got := e.waitFile("stopped", time.Second); got != "stopped" {
			t.Errorf("the command's SIGTERM trap: got = %q, expected: stopped", got)
		}
	})

	t.Run("an unreachable server exits 3, saying what it was doing in words", func(t *testing.T) {
		dead := freePort(t)
		for _, tt := range []struct {
			args  []string
			doing string
		}{
			{[]string{"lock", "x", "--", "true"}, "open session"},
			{[]string{"kv", "get", "k"}, "get"},
			{[]string{"get", "leases"}, "list leases"},
		} {
			r := e.runAt(dead, tt.args...)
			want := "Error: " + tt.doing + ": dial tcp " + dead + ": connect: connection refused\n"
			if r.code != 3 || r.stdout != "" || r.stderr != want {
				t.Errorf("tenure %s with nothing at %s: got = %v, expected: exit 3 and %q", strings.Join(tt.args, " "), dead, r, want)
			}
		}
	})

	t.Run("usage errors exit 2", func(t *testing.T) {
		for _, tt := range []struct {
			args   []string
			stderr string
		}{
			{[]string{"lock"}, "Error: tenure lock: missing NAME\nUsage: tenure lock NAME [-- CMD [ARGS...]] [flags]\nSee 'tenure lock --help'.\n"},
			{[]string{"lock", "a", "b"}, "Error: lock takes one NAME; put the command after --\n"},
			{[]string{"lock", "--bogus", "a"}, "Error: unknown flag: --bogus\nSee 'tenure lock --help'.\n"},
			{[]string{"lock", "--ttl", "4s", "--kill-grace", "1s", "a", "--", "true"},
				"Error: --kill-grace 1s must be under 1s (a quarter of --ttl 4s): the command must be dead before the server can expire the session\n"},
			{[]string{"lock", "--wait", "-1s", "a", "--", "true"}, "Error: --wait -1s must not be negative\n"},
			// The server finds these; its message alone, no RPC name.
			{[]string{"lock", "-n", "Prod", "a", "--", "true"},
				"Error: namespace \"Prod\" must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit\n"},
			{[]string{"lock", "--ttl", "25h", "a", "--", "true"}, "Error: ttl 25h0m0s is outside 2s..24h0m0s (--min-ttl, --max-ttl)\n"},
			{[]string{"get", "leases", "-l", "!!!"},
				"Error: label selector \"!!!\": label key \"!!\" must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit\n"},
			{[]string{"kv", "get", ""}, "Error: key is empty\n"},
		} {
			e.expect(2, "", tt.stderr, tt.args...)
		}
	})
}

// TestCLIShortTTLNeedsNoOtherFlags: --kill-grace and --lock-delay left
// out follow --ttl, so a short TTL works on its own, and the lock-delay
// the server records is the derived one. A --kill-grace given that does
// not fit is still refused.
func TestCLIShortTTLNeedsNoOtherFlags(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(0, "", "", "lock", "--ttl", "2s", "job", "--", "true")
	for _, tt := range []struct {
		ttl, lockDelay string
	}{
		{"2s", "1.4s"}, // kill-grace 400ms + 1s
		{"5s", "2s"},   // kill-grace 1s + 1s
		{"10s", "3s"},  // kill-grace 2s + 1s, as before
	} {
		name := "ttl-" + tt.ttl
		e.expect(0, "", "", "lock", "--ttl", tt.ttl, name, "--", "sh", "-c", e.bin+` get lease `+name+` -o json > `+name+`.json`)
		var l struct {
			Status struct {
				LockDelay string `json:"lockDelay"`
			} `json:"status"`
		}
		b, err := os.ReadFile(e.path(name + ".json"))
		if err != nil || json.Unmarshal(b, &l) != nil || l.Status.LockDelay != tt.lockDelay {
			t.Errorf("lock --ttl %s: lock-delay got = %q (%v, %s), expected: %q", tt.ttl, l.Status.LockDelay, err, b, tt.lockDelay)
		}
	}
	e.expect(0, "", "", "elect", "--ttl", "2s", "job", "--", "true")
	for _, cmd := range []string{"lock", "elect"} {
		e.expect(2, "", "Error: --kill-grace 2s must be under 500ms (a quarter of --ttl 2s): the command must be dead before the server can expire the session\n",
			cmd, "--kill-grace", "2s", "--ttl", "2s", "job", "--", "true")
	}
}

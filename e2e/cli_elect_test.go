//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// --- elections ---

func TestCLIElect(t *testing.T) {
	e := newCLIEnv(t)
	e.expect(1, "", "Error: default/sched has no leader\n", "elect", "sched", "--leader")

	obs := e.start("elect", "sched", "--observe")
	candidate := func(id, value string) *cliProc {
		return e.start("elect", "--identity", id, "--value", value, "sched", "--", "sh", "-c",
			`echo "$TENURE_FENCING_TOKEN $TENURE_HOLDER $TENURE_LEASE" > leader-`+id+`; sleep 30`)
	}
	a := candidate("cand-a", "a:1")
	fa := strings.Fields(e.waitFile("leader-cand-a", 10*time.Second))
	if len(fa) != 3 || fa[1] != "cand-a" || fa[2] != "default/sched" {
		t.Fatalf("cand-a's command environment: got = %q, expected: TOKEN cand-a default/sched", fa)
	}
	tokA := fa[0]
	leaderA := regexp.MustCompile(`^revision=\d+ leader=cand-a value="a:1" token=` + tokA + `\n$`)
	if r := e.run("elect", "sched", "--leader"); r.code != 0 || !leaderA.MatchString(r.stdout) {
		t.Errorf("elect --leader: got = %v, expected: cand-a with value a:1 and token %s", r, tokA)
	}

	b := candidate("cand-b", "b:2")
	e.waitWaiter("sched", "cand-b")
	if e.exists("leader-cand-b") {
		t.Fatalf("cand-b's command ran while cand-a leads")
	}
	if r := e.run("elect", "sched", "--leader"); !leaderA.MatchString(r.stdout) {
		t.Errorf("elect --leader with cand-b waiting: got = %v, expected: still cand-a", r)
	}

	// cand-a stops: cand-b is elected at once and runs its command.
	a.signal(t, syscall.SIGTERM)
	if code := a.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("cand-a after SIGTERM: exit code got = %d, expected: %d", code, 128+int(syscall.SIGTERM))
	}
	fb := strings.Fields(e.waitFile("leader-cand-b", 10*time.Second))
	if tb, _ := strconv.ParseInt(fb[0], 10, 64); len(fb) != 3 || fb[1] != "cand-b" || tb <= mustInt(t, tokA) {
		t.Errorf("cand-b's command environment: got = %q, expected: a token above %s and cand-b", fb, tokA)
	}
	leaderB := regexp.MustCompile(`^revision=\d+ leader=cand-b value="b:2" token=` + fb[0] + `\n$`)
	if r := e.run("elect", "sched", "--leader"); r.code != 0 || !leaderB.MatchString(r.stdout) {
		t.Errorf("elect --leader: got = %v, expected: cand-b with value b:2 and token %s", r, fb[0])
	}

	// The observer saw the election as it happened: no leader (if it
	// started first), cand-a, then (perhaps after a moment with none)
	// cand-b.
	var lines []string
	waitFor(t, 10*time.Second, "the observer to see cand-b", func() bool {
		lines = strings.Split(strings.TrimSuffix(obs.stdout.String(), "\n"), "\n")
		return strings.Contains(lines[len(lines)-1], "leader=cand-b")
	})
	var leaders []string
	for _, l := range lines {
		m := regexp.MustCompile(`^revision=\d+ leader=(\S+)`).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("elect --observe line: got = %q, expected: revision=N leader=...", l)
		}
		leaders = append(leaders, m[1])
	}
	if got := strings.Join(leaders, " "); !regexp.MustCompile(`^(<none> )?cand-a (<none> )?cand-b$`).MatchString(got) {
		t.Errorf("elect --observe: got = %q, expected: [<none>] cand-a [<none>] cand-b:\n%s", got, obs.stdout)
	}
	if !strings.Contains(obs.stdout.String(), `leader=cand-a value="a:1" token=`+tokA+"\n") {
		t.Errorf("elect --observe: got = %q, expected: cand-a's value and token", obs.stdout)
	}

	b.signal(t, syscall.SIGINT)
	if code := b.wait(t, 10*time.Second); code != 128+int(syscall.SIGINT) {
		t.Errorf("cand-b after SIGINT: exit code got = %d, expected: %d", code, 128+int(syscall.SIGINT))
	}
	obs.signal(t, syscall.SIGINT)
	if code := obs.wait(t, 10*time.Second); code != 0 {
		t.Errorf("elect --observe after SIGINT: exit code got = %d, expected: 0 (stderr %q)", code, obs.stderr)
	}
	e.expect(1, "", "Error: default/sched has no leader\n", "elect", "sched", "--leader")

	// The command's exit code is elect's too.
	e.expect(4, "", "", "elect", "sched", "--", "sh", "-c", "exit 4")

	// Losing leadership stops the command and exits non-zero; with
	// --retry, elect campaigns again and runs the command anew.
	for _, retry := range []bool{false, true} {
		name := fmt.Sprintf("loss-retry-%v", retry)
		args := []string{"elect", "--identity", name, "--kill-grace", "500ms", name}
		if retry {
			args = append(args, "--retry")
		}
		p := e.start(append(args, "--", "sh", "-c", `echo $TENURE_FENCING_TOKEN >> tokens-$TENURE_HOLDER; sleep 30`)...)
		tokens := func(n int) []string {
			var toks []string
			waitFor(t, 10*time.Second, fmt.Sprintf("%d runs of %s's command", n, name), func() bool {
				b, _ := os.ReadFile(e.path("tokens-" + name))
				toks = strings.Fields(string(b))
				return len(toks) >= n
			})
			return toks
		}
		tok := tokens(1)[0]
		e.expect(0, fmt.Sprintf("revoked default/%s token %s\n", name, tok), "", "revoke", name)
		if !retry {
			code := p.wait(t, 10*time.Second)
			if want := fmt.Sprintf("Error: lost leadership of default/%s; the command was stopped\n", name); code != 128+int(syscall.SIGTERM) || p.stderr.String() != want {
				t.Errorf("elect after a revoke: got = exit %d, stderr %q, expected: exit %d, %q", code, p.stderr, 128+int(syscall.SIGTERM), want)
			}
			continue
		}
		toks := tokens(2)
		if mustInt(t, toks[1]) <= mustInt(t, tok) {
			t.Errorf("elect --retry after a revoke: tokens got = %v, expected: a second, higher one", toks)
		}
		if want := fmt.Sprintf("tenure: lost leadership of default/%s; the command was stopped; campaigning again\n", name); p.stderr.String() != want {
			t.Errorf("elect --retry after a revoke: stderr got = %q, expected: %q", p.stderr, want)
		}
		p.signal(t, syscall.SIGTERM)
		if code := p.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
			t.Errorf("elect --retry after SIGTERM: exit code got = %d, expected: %d", code, 128+int(syscall.SIGTERM))
		}
	}
}

// TestCLIElectRetryOutlivesItsSessionWhileWaiting: with --retry, a
// candidate whose session is lost while it waits — here the server
// closes it — campaigns on with a new session, and runs its command once
// the leader steps down. Without --retry the loss ends the wait, as for
// tenure lock.
func TestCLIElectRetryOutlivesItsSessionWhileWaiting(t *testing.T) {
	e := newCLIEnv(t)
	leader := e.start("elect", "--identity", "leader", "gap", "--", "sh", "-c", `echo ready > ready-leader; sleep 30`)
	e.waitFile("ready-leader", 10*time.Second)
	waiter := e.start("elect", "--identity", "waiter", "--retry", "--ttl", "3s", "--kill-grace", "500ms", "gap", "--", "sh", "-c",
		`echo $TENURE_FENCING_TOKEN > ran-waiter; sleep 30`)
	e.waitWaiter("gap", "waiter")
	first := e.sessionOf("waiter")

	sessions := tenurev1connect.NewSessionServiceClient(http.DefaultClient, "http://"+e.endpoints)
	if _, err := sessions.Close(context.Background(), connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: first})); err != nil {
		t.Fatalf("close the waiter's session %d: %v", first, err)
	}
	waitFor(t, 10*time.Second, "the waiter to wait again with a new session", func() bool {
		id := e.sessionOf("waiter")
		return id != 0 && id != first && len(e.lease("gap").Status.Waiters) == 1
	})
	if waiter.exited() || e.exists("ran-waiter") {
		t.Fatalf("elect --retry after its session was closed: got = exited %v, ran %v (stderr %q), expected: still waiting", waiter.exited(), e.exists("ran-waiter"), waiter.stderr)
	}

	// A signal ends a wait of --retry, too.
	quitter := e.start("elect", "--identity", "quitter", "--retry", "gap", "--", "sh", "-c", `echo ran > ran-quitter`)
	e.waitWaiter("gap", "quitter")
	quitter.signal(t, syscall.SIGINT)
	if code := quitter.wait(t, 10*time.Second); code != 1 || quitter.stderr.String() != "Error: interrupted while campaigning for default/gap\n" || e.exists("ran-quitter") {
		t.Errorf("elect --retry interrupted while waiting: got = exit %d, stderr %q, expected: exit 1, \"Error: interrupted while campaigning for default/gap\", and no run", code, quitter.stderr)
	}

	leader.signal(t, syscall.SIGTERM)
	if code := leader.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Errorf("leader after SIGTERM: exit code got = %d, expected: %d", code, 128+int(syscall.SIGTERM))
	}
	e.waitFile("ran-waiter", 10*time.Second)
	waiter.signal(t, syscall.SIGTERM)
	if code := waiter.wait(t, 10*time.Second); code != 128+int(syscall.SIGTERM) || strings.Contains(waiter.stderr.String(), "Error:") {
		t.Errorf("waiter after SIGTERM: got = exit %d, stderr %q, expected: exit %d and no error", code, waiter.stderr, 128+int(syscall.SIGTERM))
	}
}

// sessionOf returns the ID of identity's open session, 0 if it has none.
func (e *cliEnv) sessionOf(identity string) int64 {
	e.t.Helper()
	r := e.run("get", "sessions", "-o", "json")
	var list struct {
		Items []struct {
			ID       int64  `json:"id"`
			Identity string `json:"identity"`
		} `json:"items"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil {
		e.t.Fatalf("tenure get sessions -o json: got = %v, expected: a list of sessions", r)
	}
	for _, s := range list.Items {
		if s.Identity == identity {
			return s.ID
		}
	}
	return 0
}

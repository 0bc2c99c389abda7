package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"
)

// auditLog collects an Auditor's lines, decoded.
type auditLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *auditLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *auditLog) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// tally counts the lines written in full and the entries the summaries
// say were folded.
func tally(lines []map[string]any) (full, folded, summaries int) {
	for _, m := range lines {
		if n, ok := m["folded"].(float64); ok {
			folded += int(n)
			summaries++
			continue
		}
		full++
	}
	return
}

func newTestAuditor(limit int, window time.Duration) (*Auditor, *auditLog) {
	l := &auditLog{}
	a := NewAuditor(slog.New(slog.NewJSONHandler(l, nil)))
	a.limit, a.window = limit, window
	return a, l
}

func denial(remote string, i int) Entry {
	return Entry{Principal: "mallory", Action: "/tenure.v1.KVService/Put", Target: fmt.Sprintf("k-%d", i), Outcome: "denied", Reason: "permission_denied: no", Remote: remote}
}

// A flood of denials from one host is written up to the limit, and the
// rest are summed up in one line when the window ends, with no further
// entry needed to bring it out.
func TestAuditorFoldsDenialsPerRemoteAndWritesTheSummaryWhenTheWindowEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	a, l := newTestAuditor(5, 50*time.Millisecond)
	defer a.Close()
	for i := range 1000 {
		// A new port for each: a new connection buys no new allowance.
		a.Record(context.Background(), denial(fmt.Sprintf("10.0.0.1:%d", 1000+i%50), i))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		full, folded, _ := tally(l.lines(t))
		if full+folded == 1000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the window: got = %d full + %d folded, expected: 1000 in all", full, folded)
		}
		time.Sleep(10 * time.Millisecond)
	}
	lines := l.lines(t)
	full, _, summaries := tally(lines)
	if full < 5 || full > 5*summaries+5 {
		t.Errorf("got = %d lines in full over %d summaries, expected: 5 per window", full, summaries)
	}
	last := lines[len(lines)-1]
	if _, ok := last["folded"]; !ok {
		t.Fatalf("last line got = %v, expected: a summary", last)
	}
	if !strings.HasPrefix(last["reason"].(string), "folded ") || !strings.Contains(last["reason"].(string), " denied entries from 10.0.0.1") {
		t.Errorf("summary reason got = %q, expected: \"folded N denied entries from 10.0.0.1 ...\"", last["reason"])
	}
	for k, want := range map[string]string{"principal": "mallory", "action": "/tenure.v1.KVService/Put", "target": "(several)", "remote": "10.0.0.1", "outcome": "denied", "level": "WARN"} {
		if last[k] != want {
			t.Errorf("summary %s got = %v, expected: %q", k, last[k], want)
		}
	}
}

// Allowed and failed entries are never folded, however many denials
// surround them; another host, and another principal from the same
// host, have allowances of their own.
func TestAuditorNeverFoldsAllowedEntriesAndCountsHostsApart(t *testing.T) {
	a, l := newTestAuditor(3, time.Hour)
	for i := range 100 {
		a.Record(context.Background(), denial("10.0.0.1:1", i))
		a.Record(context.Background(), Entry{Principal: "admin", Action: "Revoke", Target: "t", Outcome: "allowed", Remote: "10.0.0.1:1"})
		a.Record(context.Background(), Entry{Principal: "admin", Action: "Revoke", Target: "t", Outcome: "failed", Remote: "10.0.0.1:1"})
	}
	for i := range 3 {
		a.Record(context.Background(), denial("10.0.0.2:1", i))
		other := denial("10.0.0.1:2", i)
		other.Principal = "trudy"
		a.Record(context.Background(), other)
	}
	counts := map[string]int{}
	for _, m := range l.lines(t) {
		counts[m["outcome"].(string)+" "+m["remote"].(string)]++
	}
	want := map[string]int{"allowed 10.0.0.1:1": 100, "failed 10.0.0.1:1": 100, "denied 10.0.0.1:1": 3, "denied 10.0.0.2:1": 3, "denied 10.0.0.1:2": 3}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("%s: got = %d lines, expected: %d", k, counts[k], n)
		}
	}
	// The hour-long window has not ended: Close writes its summary.
	a.Close()
	a.Close()
	lines := l.lines(t)
	_, folded, summaries := tally(lines)
	if folded != 97 || summaries != 1 {
		t.Errorf("after Close: got = %d folded in %d summaries, expected: 97 in 1", folded, summaries)
	}
}

// Many goroutines and many hosts at once: every denial is either written
// or counted in a summary, and the hosts tracked stay bounded.
func TestAuditorIsExactUnderConcurrencyAndBoundedInHosts(t *testing.T) {
	defer goleak.VerifyNone(t)
	a, l := newTestAuditor(2, time.Hour)
	a.maxRemotes = 16
	var wg sync.WaitGroup
	const goroutines, each = 8, 500
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				a.Record(context.Background(), denial(fmt.Sprintf("10.0.%d.%d:9", g, i%40), i))
				a.mu.Lock()
				n := len(a.remotes)
				a.mu.Unlock()
				if n > a.maxRemotes+1 {
					t.Errorf("got = %d hosts tracked, expected: at most %d", n, a.maxRemotes+1)
					return
				}
			}
		}()
	}
	wg.Wait()
	a.Close()
	full, folded, _ := tally(l.lines(t))
	if full+folded != goroutines*each {
		t.Errorf("got = %d full + %d folded, expected: %d in all", full, folded, goroutines*each)
	}
	var overflow bool
	for _, m := range l.lines(t) {
		overflow = overflow || m["remote"] == overflowRemote
	}
	if !overflow {
		t.Errorf("got = no summary for %q, expected: hosts past the bound to share one window", overflowRemote)
	}
}

// A long target or reason is cut on a rune boundary, saying how long it
// was.
func TestAuditorTruncatesTargetsAndReasons(t *testing.T) {
	a, l := newTestAuditor(10, time.Hour)
	defer a.Close()
	key := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a rune
	a.Record(context.Background(), Entry{Principal: "p", Action: "Put", Target: key, Outcome: "denied", Reason: "permission_denied: p may not write key " + key, Remote: "r"})
	m := l.lines(t)[0]
	target, reason := m["target"].(string), m["reason"].(string)
	wantSuffix := fmt.Sprintf("...(truncated, %d bytes)", len(key))
	if !strings.HasSuffix(target, wantSuffix) || len(target) > MaxTargetBytes+len(wantSuffix) {
		t.Errorf("target got = %d bytes ending %q, expected: at most %d bytes ending %q", len(target), target[len(target)-30:], MaxTargetBytes+len(wantSuffix), wantSuffix)
	}
	if len(reason) > MaxReasonBytes+40 || !strings.Contains(reason, "...(truncated, ") {
		t.Errorf("reason got = %d bytes, expected: at most %d and a marker", len(reason), MaxReasonBytes+40)
	}
	if !utf8.ValidString(target) || !utf8.ValidString(reason) {
		t.Errorf("got = a cut inside a rune, expected: valid UTF-8")
	}
}

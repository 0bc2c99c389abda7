package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
)

// chromium finds Debian's Chromium, which .ci/run installs.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("no Chromium on this machine (.ci/run installs Debian's chromium)")
	return ""
}

// newTab starts headless Chromium and returns a tab in it, closed when
// the test ends.
func newTab(t *testing.T, ctx context.Context, browser string) context.Context {
	allocCtx, allocCancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(browser),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	tab, tabCancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		tabCancel()
		allocCancel()
	})
	return tab
}

// TestWebPageShowsWhoHoldsWhatAndFollowsChanges opens the page in headless
// Chromium, as an operator would, and checks that it shows the holder of
// a lease, its token and a waiter, then updates by itself when the lease
// changes hands.
func TestWebPageShowsWhoHoldsWhatAndFollowsChanges(t *testing.T) {
	browser := chromium(t)
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	c, err := client.New(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	alice, err := c.NewSession(ctx, client.WithIdentity("alice"), client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close(context.Background())
	bob, err := c.NewSession(ctx, client.WithIdentity("bob"), client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close(context.Background())
	held := alice.Mutex("nightly-report")
	if err := held.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiting := bob.Mutex("nightly-report")
	bobLocked := make(chan error, 1)
	go func() { bobLocked <- waiting.Lock(ctx) }()

	tab := newTab(t, ctx, browser)

	leaseRow := func(name string) string {
		text, _ := chromedp.Run(tab, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("#leases tbody tr")).map(r => r.innerText).filter(t => t.includes(`+"`"+name+"`"+`)).join("\n")`))
		return text
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("page never showed %s; leases table: %q", what, leaseRow("nightly-report"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	if title, err := chromedp.Run(tab, chromedp.Title()); err != nil || title != "Tenure" {
		t.Fatalf("title got = %q (%v), expected: Tenure", title, err)
	}
	aliceTok, _ := held.Token()
	aliceToken := aliceTok.Token
	waitFor("alice holding with her token and bob waiting", func() bool {
		row := leaseRow("nightly-report")
		fields := strings.Split(row, "\t")
		// Namespace, Name, Holder, Token, Held for, TTL, Waiters, ...
		return len(fields) >= 7 && fields[2] == "alice" && fields[3] == strconv.FormatInt(aliceToken, 10) && fields[6] == "1"
	})

	// Hand over: the page follows the lease watch and updates by itself.
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-bobLocked; err != nil {
		t.Fatal(err)
	}
	defer waiting.Unlock(context.Background())
	bobTok, _ := waiting.Token()
	waitFor("bob holding after the handover", func() bool {
		fields := strings.Split(leaseRow("nightly-report"), "\t")
		return len(fields) >= 7 && fields[2] == "bob" && fields[3] == strconv.FormatInt(bobTok.Token, 10) && fields[6] == "0"
	})
	events, err := chromedp.Run(tab, chromedp.Text("#events"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"released default/nightly-report holder=alice", "acquired default/nightly-report holder=bob"} {
		if !strings.Contains(events, want) {
			t.Errorf("events got = %q, expected: a line containing %q", events, want)
		}
	}
}

// webPolicy: team-a and team-b each lock in their own namespace;
// viewer-a may only read team-a's.
const webPolicy = `
principals:
  - name: team-a
    roles: [team-a]
    tokens: [{sha256: "%s"}]
  - name: team-b
    roles: [team-b]
    tokens: [{sha256: "%s"}]
  - name: viewer-a
    roles: [viewer-a]
    tokens: [{sha256: "%s"}]
roles:
  team-a:
    - namespaces: [team-a]
      verbs: [read, lock]
  team-b:
    - namespaces: [team-b]
      verbs: [read, lock]
  viewer-a:
    - namespaces: [team-a]
      verbs: [read]
`

// TestWebPageWithAuthShowsOnlyWhatTheTokenMayRead opens the page of a
// server with a policy: without a token it says one is needed and shows
// nothing; with viewer-a's token, pasted into the form, it shows team-a's
// lease and not team-b's, follows team-a's changes through the watch, and
// keeps the token in the tab's sessionStorage only. Forget empties the
// page again, and the refused watch then retries once a second, not in a
// hot loop.
func TestWebPageWithAuthShowsOnlyWhatTheTokenMayRead(t *testing.T) {
	browser := chromium(t)
	teamA, teamB, viewerA := auth.NewToken(), auth.NewToken(), auth.NewToken()
	addr := testserver.StartWithPolicy(t, testserver.Limits(),
		fmt.Sprintf(webPolicy, auth.HashToken(teamA), auth.HashToken(teamB), auth.HashToken(viewerA)))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	session := func(token string, opts ...client.SessionOption) *client.Session {
		t.Helper()
		c, err := client.New(ctx, []string{addr}, client.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		s, err := c.NewSession(ctx, append(opts, client.WithTTL(10*time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s
	}
	a, b := session(teamA), session(teamB)
	alpha := a.Mutex("alpha", client.WithNamespace("team-a"))
	if err := alpha.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Mutex("beta", client.WithNamespace("team-b")).Lock(ctx); err != nil {
		t.Fatal(err)
	}

	tab := newTab(t, ctx, browser)
	eval := func(js string) string {
		out, _ := chromedp.Run(tab, chromedp.Evaluate[string](js))
		return out
	}
	status := func() string { return eval(`document.getElementById("status").textContent`) }
	// Namespace, Name, Holder, Token, ...: one line per row.
	leases := func() string {
		return eval(`Array.from(document.querySelectorAll("#leases tbody tr")).map(r => r.innerText).join("\n")`)
	}
	row := func(namespace, name string) []string {
		for _, line := range strings.Split(leases(), "\n") {
			if f := strings.Split(line, "\t"); len(f) >= 4 && f[0] == namespace && f[1] == name {
				return f
			}
		}
		return nil
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("page never showed %s; status: %q, leases table: %q", what, status(), leases())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	waitFor("that a token is needed", func() bool { return strings.Contains(status(), "this server needs a token") })
	if got := leases(); got != "" {
		t.Errorf("leases table without a token got = %q, expected: no rows", got)
	}

	if err := chromedp.Do(tab,
		chromedp.SendKeys(chromedp.ID("token"), viewerA),
		chromedp.Click(chromedp.ID("use-token")),
	); err != nil {
		t.Fatal(err)
	}
	alphaTok, _ := alpha.Token()
	waitFor("team-a holding team-a/alpha", func() bool {
		f := row("team-a", "alpha")
		return f != nil && f[2] == "team-a" && f[3] == strconv.FormatInt(alphaTok.Token, 10)
	})
	if got := leases(); strings.Contains(got, "beta") || strings.Contains(got, "team-b") {
		t.Errorf("leases table for viewer-a got = %q, expected: nothing of team-b", got)
	}
	if got := eval(`document.querySelector("#sessions tbody").innerText`); strings.Contains(got, "team-b") {
		t.Errorf("sessions table for viewer-a got = %q, expected: no session of team-b", got)
	}
	for _, c := range []struct{ js, want string }{
		{`sessionStorage.getItem("tenure-token") || ""`, viewerA},
		{`JSON.stringify(Object.assign({}, localStorage))`, "{}"},
		{`location.href`, "http://" + addr + "/"},
		{`document.getElementById("token").value`, ""},
	} {
		if got := eval(c.js); got != c.want {
			t.Errorf("%s got = %q, expected: %q", c.js, got, c.want)
		}
	}

	// Hand alpha over within team-a, and let team-b change its own
	// namespace: the page follows the first through the watch, and never
	// hears of the second.
	if err := b.Mutex("gamma", client.WithNamespace("team-b")).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := alpha.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	next := session(teamA, client.WithIdentity("team-a/worker-2")).Mutex("alpha", client.WithNamespace("team-a"))
	if err := next.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	nextTok, _ := next.Token()
	waitFor("team-a/worker-2 holding team-a/alpha after the handover", func() bool {
		f := row("team-a", "alpha")
		return f != nil && f[2] == "team-a/worker-2" && f[3] == strconv.FormatInt(nextTok.Token, 10)
	})
	events := ""
	waitFor("the handover in the events", func() bool {
		events = eval(`document.getElementById("events").innerText`)
		return strings.Contains(events, "released team-a/alpha holder=team-a") &&
			strings.Contains(events, "acquired team-a/alpha holder=team-a/worker-2")
	})
	if strings.Contains(events, "team-b") {
		t.Errorf("events for viewer-a got = %q, expected: nothing of team-b", events)
	}

	// Forget: the tab holds no token, and the page asks for one again.
	if err := chromedp.Do(tab, chromedp.Click(chromedp.ID("forget-token"))); err != nil {
		t.Fatal(err)
	}
	waitFor("that a token is needed again", func() bool {
		return strings.Contains(status(), "this server needs a token") && leases() == ""
	})
	if got := eval(`sessionStorage.getItem("tenure-token") || ""`); got != "" {
		t.Errorf("sessionStorage after Forget got = %q, expected: no token", got)
	}

	// A refused watch tries again once a second, not in a hot loop: count
	// the page's watch requests over 2.5 seconds of refusals.
	watches, err := chromedp.Run(tab, chromedp.Evaluate[int](`
		performance.setResourceTimingBufferSize(100000);
		performance.clearResourceTimings();
		new Promise(done => setTimeout(() => done(performance.getEntriesByType("resource")
			.filter(e => e.name.includes("/v1/watch/leases")).length), 2500))`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if watches > 5 {
		t.Errorf("watch requests in 2.5s of 401s got = %d, expected: about one a second", watches)
	}
}

// TestWebPageShowsTheMembers opens the page of a follower of a
// three-node cluster: it lists every member with its API address, role,
// vote and applied index, the leader marked, and shows a member that
// goes down as unreachable.
func TestWebPageShowsTheMembers(t *testing.T) {
	browser := chromium(t)
	if testing.Short() {
		t.Skip("runs a three-node cluster of processes")
	}
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nodes := newClusterNodes(t, bin, 3)
	for _, n := range nodes {
		n.start()
	}
	ms, leader := settled(t, bin, endpointsOf(nodes), 3, 0, 20*time.Second)
	var page, down *clusterNode
	for _, n := range nodes {
		switch {
		case n.id == leader:
		case page == nil:
			page = n
		default:
			down = n
		}
	}

	tab := newTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+page.api+"/")); err != nil {
		t.Fatal(err)
	}
	// ID, API address, Peer address, Role, Voter, Term, Applied index
	rows := func() map[string][]string {
		text, _ := chromedp.Run(tab, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("#members tbody tr")).map(r => r.innerText).join("\n")`))
		out := map[string][]string{}
		for _, line := range strings.Split(text, "\n") {
			fields := strings.Split(line, "\t")
			if len(fields) == 7 {
				out[strings.TrimPrefix(fields[0], "★ ")] = fields
			}
		}
		return out
	}
	showsAll := func(r map[string][]string) bool {
		if len(r) != 3 {
			return false
		}
		for _, m := range ms {
			f := r[m.ID]
			role := "follower"
			if m.ID == leader {
				role = "leader"
			}
			if m.ID == page.id {
				role += " (this node)"
			}
			applied, _ := strconv.ParseUint(f[6], 10, 64)
			if f == nil || f[1] != m.APIAddress || f[2] != m.PeerAddress || f[3] != role || f[4] != "yes" || applied == 0 ||
				strings.HasPrefix(f[0], "★ ") != (m.ID == leader) {
				return false
			}
		}
		return true
	}
	var got map[string][]string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("members table got = %q, expected for %+v", got, ms)
		}
	})
	within(t, 20*time.Second, "page listing the three members", func() bool {
		got = rows()
		return showsAll(got)
	})

	down.kill()
	within(t, 20*time.Second, "page showing "+down.id+" unreachable", func() bool {
		got = rows()
		return got[down.id] != nil && got[down.id][3] == "unreachable"
	})
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
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

// pageLeases reads the page's lease table: one map per row, from each
// column's heading to the text of its cell, and from "<heading> title" to
// the tooltips in that cell (one a line) where it has any. Tests name the
// column they check, so a new column moves nothing. The "No leases yet."
// row is left out.
func pageLeases(tab context.Context) []map[string]string {
	rows, _ := chromedp.Run(tab, chromedp.Evaluate[[]map[string]string](`(() => {
		const heads = Array.from(document.querySelectorAll("#leases thead th"), th => th.textContent);
		return Array.from(document.querySelectorAll("#leases tbody tr"))
			.filter(tr => !tr.querySelector(".empty"))
			.map(tr => Object.fromEntries(Array.from(tr.cells).flatMap((td, i) => {
				const titles = [td, ...td.querySelectorAll("[title]")].map(e => e.title).filter(Boolean);
				return titles.length ? [[heads[i], td.innerText], [heads[i] + " title", titles.join("\n")]] : [[heads[i], td.innerText]];
			})));
	})()`))
	return rows
}

// pageLease is the row of namespace/name in rows, or nil.
func pageLease(rows []map[string]string, namespace, name string) map[string]string {
	for _, r := range rows {
		if r["Namespace"] == namespace && r["Name"] == name {
			return r
		}
	}
	return nil
}

// jsonCall makes one call of the JSON API as the page does, a POST to
// /tenure.v1.<method>, and decodes the answer into out (if not nil).
// Tests use it for what the Go client would not do, such as a session
// that never heartbeats. It must be called from the test's goroutine.
func jsonCall(t *testing.T, ctx context.Context, addr, method string, in, out any) {
	t.Helper()
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/tenure.v1."+method, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: got = %s %s, expected: 200 OK", method, body, resp.Status, answer)
	}
	if out != nil {
		if err := json.Unmarshal(answer, out); err != nil {
			t.Fatalf("%s: %v in %s", method, err, answer)
		}
	}
}

// jsonOpenSession opens a session through the JSON API and returns its ID.
// Nothing heartbeats it: it expires ttl after it opened unless the test
// closes it first.
func jsonOpenSession(t *testing.T, ctx context.Context, addr, identity, ttl string) int64 {
	t.Helper()
	var opened struct {
		Session struct {
			ID int64 `json:"id,string"`
		} `json:"session"`
	}
	jsonCall(t, ctx, addr, "SessionService/Open", map[string]any{"identity": identity, "ttl": ttl}, &opened)
	return opened.Session.ID
}

// jsonAcquire takes the lease name in the default namespace for session
// through the JSON API, without waiting, and returns the fencing token.
func jsonAcquire(t *testing.T, ctx context.Context, addr string, session int64, name string) int64 {
	t.Helper()
	var acquired struct {
		Acquired bool  `json:"acquired"`
		Token    int64 `json:"token,string"`
	}
	jsonCall(t, ctx, addr, "LeaseService/Acquire", map[string]any{"sessionId": session, "name": name}, &acquired)
	if !acquired.Acquired {
		t.Fatalf("acquire %s: got = not acquired, expected: a grant", name)
	}
	return acquired.Token
}

// TestWebPageShowsWhoHoldsWhatAndFollowsChanges opens the page in headless
// Chromium, as an operator would, and checks that it shows the holder of
// a lease, its token and a waiter ("Held, 1 waiting"), then updates by
// itself when the lease changes hands.
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

	// waitFor waits until the nightly-report row satisfies ok (a missing
	// row reads as empty cells).
	waitFor := func(what string, ok func(row map[string]string) bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			row := pageLease(pageLeases(tab), "default", "nightly-report")
			if ok(row) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("page never showed %s; nightly-report row: %q", what, row)
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
	waitFor("alice holding with her token and bob waiting", func(r map[string]string) bool {
		return r["Holder"] == "alice" && r["Token"] == strconv.FormatInt(aliceToken, 10) && r["Waiters"] == "1" &&
			r["Status"] == "Held, 1 waiting"
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
	waitFor("bob holding after the handover", func(r map[string]string) bool {
		return r["Holder"] == "bob" && r["Token"] == strconv.FormatInt(bobTok.Token, 10) && r["Waiters"] == "0" &&
			r["Status"] == "Held"
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
	// The whole table as text, one line per row.
	leases := func() string {
		return eval(`Array.from(document.querySelectorAll("#leases tbody tr")).map(r => r.innerText).join("\n")`)
	}
	row := func(namespace, name string) map[string]string { return pageLease(pageLeases(tab), namespace, name) }
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
		r := row("team-a", "alpha")
		return r != nil && r["Holder"] == "team-a" && r["Token"] == strconv.FormatInt(alphaTok.Token, 10)
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
		r := row("team-a", "alpha")
		return r != nil && r["Holder"] == "team-a/worker-2" && r["Token"] == strconv.FormatInt(nextTok.Token, 10)
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

// TestWebPageShowsHowEachLeaseEnded: once nobody holds a lease, the page
// says how its last grant ended and how long ago, like `tenure get
// leases` — "Released 3s ago" for a lease its holder unlocked, "Expired
// 1s ago" for one whose holder's session ran out — and names that last
// holder in the Holder column, so an operator sees who had it. The expiry
// is made through the JSON API: a session opened with a 1s TTL that
// never heartbeats, which the Go client would not allow.
func TestWebPageShowsHowEachLeaseEnded(t *testing.T) {
	browser := chromium(t)
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	c, err := client.New(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	worker3, err := c.NewSession(ctx, client.WithIdentity("worker-3"), client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer worker3.Close(context.Background())
	report := worker3.Mutex("nightly-report")
	if err := report.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := report.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	worker7 := jsonOpenSession(t, ctx, addr, "worker-7", "1s")
	opened := time.Now()
	jsonAcquire(t, ctx, addr, worker7, "payments-batch")

	tab := newTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	ended := regexp.MustCompile(`^(Released|Expired|Revoked) (\d+)s ago$`)
	// age is the N of "<how> Ns ago" in the Status cell, or -1 when the
	// cell does not say so.
	age := func(row map[string]string, how string) int {
		m := ended.FindStringSubmatch(row["Status"])
		if m == nil || m[1] != how {
			return -1
		}
		n, _ := strconv.Atoi(m[2])
		return n
	}
	// Both rows come from one reading, and so from one rendering.
	var rep, pay map[string]string
	within(t, 20*time.Second, "page showing nightly-report released and payments-batch expired", func() bool {
		rows := pageLeases(tab)
		rep, pay = pageLease(rows, "default", "nightly-report"), pageLease(rows, "default", "payments-batch")
		return age(rep, "Released") >= 0 && age(pay, "Expired") >= 0
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nightly-report row: %q\npayments-batch row: %q", rep, pay)
		}
	})

	for _, tc := range []struct {
		row          map[string]string
		column, want string
	}{
		{rep, "Holder", "— (last: worker-3)"},
		{pay, "Holder", "— (last: worker-7)"},
		{rep, "Token", ""},
		{pay, "Token", ""},
		{rep, "Held for", ""},
		{pay, "Held for", ""},
		{rep, "Waiters", "0"},
		{pay, "Waiters", "0"},
	} {
		if got := tc.row[tc.column]; got != tc.want {
			t.Errorf("%s of %s: got = %q, expected: %q", tc.column, tc.row["Name"], got, tc.want)
		}
	}
	// The ages come from each lease's last.endTime. The page showed the
	// expiry, so it read the table at least a TTL (1s) after the release.
	if n, most := age(rep, "Released"), int(time.Since(released).Seconds())+1; n < 1 || n > most {
		t.Errorf("age of the release: got = %ds, expected: from 1s to %ds", n, most)
	}
	if n, most := age(pay, "Expired"), int(time.Since(opened).Seconds()); n < 0 || n > most {
		t.Errorf("age of the expiry: got = %ds, expected: at most %ds", n, most)
	}
	// The Status cell's tooltip tells the rest: who, and why it ended.
	if got := pay["Status title"]; !strings.Contains(got, "worker-7") || !strings.Contains(got, "session expired") {
		t.Errorf("Status tooltip of payments-batch: got = %q, expected: worker-7 and why (session expired)", got)
	}
}

// TestWebPageShowsThePreferredHolderAndWhoIsAskedToStepDown: a lease
// with a preferred holder says so in its Holder cell ("prefers
// sched-2"); once sched-2 waits, the holder in its way is marked as
// asked to step down — it still holds, and the page says so — and once
// it releases, sched-2 holds and is marked as the preferred holder.
// sched-1 holds through the JSON API, which, unlike the Go client and
// the CLI, does not step down by itself.
func TestWebPageShowsThePreferredHolderAndWhoIsAskedToStepDown(t *testing.T) {
	browser := chromium(t)
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	c, err := client.New(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sched1 := jsonOpenSession(t, ctx, addr, "sched-1", "60s")
	token1 := jsonAcquire(t, ctx, addr, sched1, "scheduler")

	tab := newTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	var row map[string]string // the scheduler row, as last read
	var events string         // the page's list of events, as last read
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("scheduler row: %q\nevents: %q", row, events)
		}
	})
	shows := func(what string, ok func() bool) {
		t.Helper()
		within(t, 20*time.Second, "page showing "+what, func() bool {
			row = pageLease(pageLeases(tab), "default", "scheduler")
			return ok()
		})
	}
	shows("sched-1 holding", func() bool { return row["Holder"] == "sched-1" && row["Status"] == "Held" })

	if _, err := c.SetPreferredHolder(ctx, "default", "scheduler", "sched-2"); err != nil {
		t.Fatal(err)
	}
	shows("the preferred holder", func() bool {
		return row["Holder"] == "sched-1 · prefers sched-2" && row["Status"] == "Held"
	})

	sched2, err := c.NewSession(ctx, client.WithIdentity("sched-2"), client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer sched2.Close(context.Background())
	next := sched2.Mutex("scheduler")
	lockCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	locked := make(chan error, 1)
	go func() { locked <- next.Lock(lockCtx) }()
	shows("sched-1 asked to step down while sched-2 waits", func() bool {
		return row["Holder"] == "sched-1 (asked to step down) · prefers sched-2" && row["Status"] == "Held, 1 waiting" &&
			row["Token"] == strconv.FormatInt(token1, 10)
	})
	if got := row["Holder title"]; !strings.Contains(got, "asked to step down: ") || !strings.Contains(got, "sched-2") {
		t.Errorf("Holder tooltip: got = %q, expected: why sched-1 is asked to step down, naming sched-2", got)
	}

	jsonCall(t, ctx, addr, "LeaseService/Release", map[string]any{"namespace": "default", "name": "scheduler", "token": token1}, nil)
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	defer next.Unlock(context.Background())
	token2, _ := next.Token()
	shows("sched-2 holding as the preferred holder", func() bool {
		return row["Holder"] == "sched-2 (preferred)" && row["Status"] == "Held" && row["Token"] == strconv.FormatInt(token2.Token, 10)
	})
	within(t, 20*time.Second, "the preference and the step-down in the events", func() bool {
		events, _ = chromedp.Run(tab, chromedp.Evaluate[string](`document.getElementById("events").innerText`))
		return strings.Contains(events, "preferred holder set default/scheduler holder=sched-2") &&
			strings.Contains(events, "step down default/scheduler holder=sched-1")
	})
}

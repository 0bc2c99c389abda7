package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
// row, and the spacers that stand for the rows out of view, are left out.
func pageLeases(tab context.Context) []map[string]string {
	rows, _ := chromedp.Run(tab, chromedp.Evaluate[[]map[string]string](`(() => {
		const heads = Array.from(document.querySelectorAll("#leases thead th"), th => th.textContent);
		return Array.from(document.querySelectorAll("#leases tbody tr"))
			.filter(tr => !tr.querySelector(".empty") && !tr.classList.contains("spacer"))
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

// pageEval runs js in the tab and decodes its value. A failure reads as
// the zero value, so that a polling loop simply asks again.
func pageEval[T any](tab context.Context, js string) T {
	v, _ := chromedp.Run(tab, chromedp.Evaluate[T](js))
	return v
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// laneBar is one bar of the page's timeline: a grant, as drawn.
type laneBar struct {
	Holder string  `json:"holder"`
	Token  string  `json:"token"`
	Class  string  `json:"class"`
	Left   float64 `json:"left"`  // percent of the window
	Width  float64 `json:"width"` // percent of the window
}

// pageLane is what the timeline draws in the lane of a lease.
type pageLane struct {
	Bars  []laneBar `json:"bars"`  // left to right
	Marks []string  `json:"marks"` // their kinds, left to right: handoff, expired, revoked…
	Waits []string  `json:"waits"` // who waited
}

// readLane reads the lane of key ("namespace/name"), or nil while the
// timeline draws none.
func readLane(tab context.Context, key string) *pageLane {
	return pageEval[*pageLane](tab, `(() => {
		const lane = [...document.querySelectorAll(".tl-lane")].find(l => l.dataset.lease === `+jsString(key)+`);
		if (!lane) return null;
		const byLeft = (a, b) => parseFloat(a.style.left) - parseFloat(b.style.left);
		return {
			bars: [...lane.querySelectorAll(".tl-bar")].sort(byLeft).map(b => ({holder: b.dataset.holder, token: b.dataset.token,
				class: b.className, left: parseFloat(b.style.left), width: parseFloat(b.style.width)})),
			marks: [...lane.querySelectorAll(".tl-mark")].sort(byLeft).map(m => m.className.replace("tl-mark ", "")),
			waits: [...lane.querySelectorAll(".tl-wait")].sort(byLeft).map(w => w.dataset.holder),
		};
	})()`)
}

// pointAt points at the first element matching sel in the lane of key
// (mouse over its middle), as an operator pointing at a bar or a mark,
// and returns the tooltip that comes up. With click, it clicks it too
// and returns the text pinned under the timeline. The events go to the
// element itself: the lanes are redrawn every second, and a bar a few
// pixels wide moves under a fixed point.
func pointAt(t *testing.T, tab context.Context, key, sel string, click bool) string {
	t.Helper()
	text := pageEval[*string](tab, `(() => {
		const lane = [...document.querySelectorAll(".tl-lane")].find(l => l.dataset.lease === `+jsString(key)+`);
		const el = lane && lane.querySelector(`+jsString(sel)+`);
		if (!el) return null;
		const r = el.getBoundingClientRect();
		const at = {bubbles: true, clientX: r.left + r.width / 2, clientY: r.top + r.height / 2};
		el.dispatchEvent(new MouseEvent("mouseover", at));
		if (`+strconv.FormatBool(click)+`) {
			el.dispatchEvent(new MouseEvent("click", at));
			return document.getElementById("tl-info").innerText;
		}
		const tip = document.getElementById("tl-tip");
		return tip.hidden ? "" : tip.innerText;
	})()`)
	if text == nil {
		t.Fatalf("no %s in the lane of %s", sel, key)
	}
	return *text
}

// setField types value into the filter or form field id, replacing what
// it held, as a paste would.
func setField(t *testing.T, tab context.Context, id, value string) {
	t.Helper()
	if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](`(() => {
		const el = document.getElementById(`+jsString(id)+`);
		el.value = `+jsString(value)+`;
		el.dispatchEvent(new Event("input", {bubbles: true}));
		el.dispatchEvent(new Event("change", {bubbles: true}));
		return true;
	})()`)); err != nil {
		t.Fatal(err)
	}
}

// pageQuery is the page's address' query, decoded.
func pageQuery(tab context.Context) map[string]string {
	return pageEval[map[string]string](tab, `Object.fromEntries(new URL(location.href).searchParams)`)
}

// jsonAcquireWith acquires through the JSON API with the fields of req
// (sessionId, namespace, name, value, labels…), without waiting, and
// returns the fencing token.
func jsonAcquireWith(t *testing.T, ctx context.Context, addr string, req map[string]any) int64 {
	t.Helper()
	var acquired struct {
		Acquired bool  `json:"acquired"`
		Token    int64 `json:"token,string"`
	}
	jsonCall(t, ctx, addr, "LeaseService/Acquire", req, &acquired)
	if !acquired.Acquired {
		t.Fatalf("acquire %v: got = not acquired, expected: a grant", req)
	}
	return acquired.Token
}

// jsonWaiters is the identities waiting for namespace/name, in queue
// order, as the JSON API's Get answers.
func jsonWaiters(t *testing.T, ctx context.Context, addr, namespace, name string) []string {
	t.Helper()
	var got struct {
		Lease struct {
			Waiters []struct {
				HolderIdentity string `json:"holderIdentity"`
			} `json:"waiters"`
		} `json:"lease"`
	}
	jsonCall(t, ctx, addr, "LeaseService/Get", map[string]any{"namespace": namespace, "name": name}, &got)
	var out []string
	for _, w := range got.Lease.Waiters {
		out = append(out, w.HolderIdentity)
	}
	return out
}

// writeScreenshot saves what the tab shows as docs/img/<name> when
// TENURE_WRITE_SCREENSHOT=1, so that CI never rewrites the picture.
func writeScreenshot(t *testing.T, tab context.Context, name string) {
	t.Helper()
	if os.Getenv("TENURE_WRITE_SCREENSHOT") != "1" {
		return
	}
	png, err := chromedp.Run(tab, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "docs", "img", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// TestWebPageTimelineShowsAHandover: alice holds payments-batch, bob
// waits for it, alice releases and bob is granted. The timeline, open
// all along, draws two bars in the lease's lane, alice's then bob's,
// each labelled with its holder and token, bob's wait under them, and a
// handoff mark where they meet. Pointing at alice's bar tells who held
// it, with which token, from when to when and that she released it;
// clicking the handoff mark names both holders and tokens and why it
// changed hands. Opened afresh, the page draws the same from the watch's
// replay of the server's history.
func TestWebPageTimelineShowsAHandover(t *testing.T) {
	browser := chromium(t)
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	c, err := client.New(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	screenshot := os.Getenv("TENURE_WRITE_SCREENSHOT") == "1"
	if screenshot {
		webScenery(t, ctx, c, addr)
	}

	tab := newTab(t, ctx, browser)
	if screenshot {
		if err := chromedp.Do(tab, chromedp.EmulateViewport(1440, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	page := "http://" + addr + "/?window=all"
	if _, err := chromedp.Run(tab, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	const key = "default/payments-batch"
	alice := jsonOpenSession(t, ctx, addr, "alice", "60s")
	aliceToken := jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": alice, "name": "payments-batch", "value": "batch 0412"})
	bobSession, err := c.NewSession(ctx, client.WithIdentity("bob"), client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer bobSession.Close(context.Background())
	bob := bobSession.Mutex("payments-batch")
	bobLocked := make(chan error, 1)
	go func() { bobLocked <- bob.Lock(ctx) }()
	within(t, 20*time.Second, "bob in the queue", func() bool { return len(jsonWaiters(t, ctx, addr, "default", "payments-batch")) == 1 })
	// A wait long enough to see; the picture for the docs shows more.
	hold := 300 * time.Millisecond
	if screenshot {
		hold = 3 * time.Second
	}
	time.Sleep(hold)
	jsonCall(t, ctx, addr, "LeaseService/Release", map[string]any{"name": "payments-batch", "token": aliceToken}, nil)
	if err := <-bobLocked; err != nil {
		t.Fatal(err)
	}
	defer bob.Unlock(context.Background())
	bobTok, _ := bob.Token()
	a, b := strconv.FormatInt(aliceToken, 10), strconv.FormatInt(bobTok.Token, 10)

	var got *pageLane
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lane of %s: %+v", key, got)
		}
	})
	// handedOver: alice's bar then bob's, touching, and a handoff mark.
	handedOver := func() bool {
		got = readLane(tab, key)
		if got == nil || len(got.Bars) != 2 || !slices.Contains(got.Marks, "handoff") {
			return false
		}
		first, second := got.Bars[0], got.Bars[1]
		return first.Holder == "alice" && first.Token == a && strings.Contains(first.Class, "end-released") &&
			second.Holder == "bob" && second.Token == b && strings.Contains(second.Class, "open") &&
			second.Left >= first.Left+first.Width-0.5 && slices.Equal(got.Waits, []string{"bob"})
	}
	within(t, 20*time.Second, "the handover drawn live: alice's bar, then bob's, a handoff mark", handedOver)

	for _, c := range []struct {
		what, sel string
		click     bool
		want      []string
	}{
		{"pointing at alice's bar", `.tl-bar[data-holder="alice"]`, false,
			[]string{key, "alice, token " + a, "held from ", " to ", "ended: released", "next: bob (token " + b + ")", "value: batch 0412"}},
		{"pointing at bob's bar", `.tl-bar[data-holder="bob"]`, false,
			[]string{"bob, token " + b, "and still held", "before: alice (token " + a + "), released", "waited "}},
		{"clicking the handoff mark", ".tl-mark.handoff", true,
			[]string{"handoff of " + key, "alice (token " + a + ") → bob (token " + b + ")", "why: alice's grant was released", "bob had waited "}},
	} {
		text := pointAt(t, tab, key, c.sel, c.click)
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: got = %q, expected: a text containing %q", c.what, text, w)
			}
		}
	}
	if screenshot {
		time.Sleep(2 * time.Second) // bob's bar grows
		pointAt(t, tab, key, ".tl-mark.handoff", true)
		pointAt(t, tab, key, `.tl-bar[data-holder="alice"]`, false)
		writeScreenshot(t, tab, "web-page.png")
		if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(`#leases tr[data-lease="default/nightly-report"]`))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		writeScreenshot(t, tab, "web-detail.png")
	}

	// Opened again, the page knows only what the watch replays.
	if _, err := chromedp.Run(tab, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	within(t, 20*time.Second, "the same handover drawn from the replayed history", handedOver)
}

// webScenery adds leases around the handover for the picture in the
// docs: a lease with a queue and labels, one asked to step down for its
// preferred holder, a semaphore, and one whose holder's session expires.
func webScenery(t *testing.T, ctx context.Context, c *client.Client, addr string) {
	t.Helper()
	worker3 := jsonOpenSession(t, ctx, addr, "worker-3", "60s")
	jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": worker3, "name": "nightly-report", "value": "run 2026-11-23",
		"labels": map[string]string{"team": "data", "tier": "batch"}, "maxHold": "3600s"})
	for _, who := range []string{"worker-5", "worker-8"} {
		s := jsonOpenSession(t, ctx, addr, who, "60s")
		go func() {
			body := fmt.Sprintf(`{"sessionId":"%d","name":"nightly-report","wait":true,"waitTimeout":"30s"}`, s)
			resp, err := http.Post("http://"+addr+"/tenure.v1.LeaseService/Acquire", "application/json", strings.NewReader(body))
			if err == nil {
				resp.Body.Close()
			}
		}()
		within(t, 10*time.Second, who+" waiting", func() bool {
			return slices.Contains(jsonWaiters(t, ctx, addr, "default", "nightly-report"), who)
		})
	}
	sched1 := jsonOpenSession(t, ctx, addr, "sched-1", "60s")
	jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": sched1, "namespace": "ops", "name": "scheduler", "value": "10.0.0.7:8080"})
	if _, err := c.SetPreferredHolder(ctx, "ops", "scheduler", "sched-2"); err != nil {
		t.Fatal(err)
	}
	sched2 := jsonOpenSession(t, ctx, addr, "sched-2", "60s")
	go func() {
		body := fmt.Sprintf(`{"sessionId":"%d","namespace":"ops","name":"scheduler","wait":true,"waitTimeout":"30s"}`, sched2)
		resp, err := http.Post("http://"+addr+"/tenure.v1.LeaseService/Acquire", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
	}()
	for i, who := range []string{"etl-1", "etl-2"} {
		s := jsonOpenSession(t, ctx, addr, who, "60s")
		jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": s, "namespace": "ops", "name": "etl-slots", "capacity": 3,
			"value": fmt.Sprintf("shard %d", i)})
	}
	gone := jsonOpenSession(t, ctx, addr, "cron-7", "1s")
	jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": gone, "name": "cleanup"})
	time.Sleep(1500 * time.Millisecond)
}

// TestWebPageFiltersNarrowTheLeasesAndStayInTheAddress: the namespace
// and label selector go to the server's List, the search text matches
// names, holders and values, and each narrows the lease table and the
// timeline's lanes alike. The address carries the filters, so that the
// same view opens from a shared link; a selector the server refuses is
// shown by the filters, not as a server failure.
func TestWebPageFiltersNarrowTheLeasesAndStayInTheAddress(t *testing.T) {
	browser := chromium(t)
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	alice := jsonOpenSession(t, ctx, addr, "alice", "60s")
	bob := jsonOpenSession(t, ctx, addr, "bob", "60s")
	for _, l := range []struct {
		session         int64
		namespace, name string
		labels          map[string]string
		value           string
	}{
		{alice, "team-a", "payments-batch", map[string]string{"team": "pay", "tier": "gold"}, "10.0.0.1:9000"},
		{alice, "team-a", "reports", map[string]string{"team": "data"}, ""},
		{bob, "team-b", "payments-sync", map[string]string{"team": "pay"}, ""},
		{bob, "default", "nightly", nil, "run 42"},
	} {
		jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": l.session, "namespace": l.namespace, "name": l.name,
			"labels": l.labels, "value": l.value})
	}

	tab := newTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/?window=all")); err != nil {
		t.Fatal(err)
	}
	// shown is the leases in the table and the lanes of the timeline,
	// each as "namespace/name", in order.
	type shown struct{ Rows, Lanes []string }
	var got shown
	read := func() shown {
		return pageEval[shown](tab, `({
			Rows: [...document.querySelectorAll("#leases tbody tr[data-lease]")].map(r => r.dataset.lease),
			Lanes: [...document.querySelectorAll(".tl-lane")].map(l => l.dataset.lease),
		})`)
	}
	shows := func(what string, want ...string) {
		t.Helper()
		within(t, 20*time.Second, what, func() bool {
			got = read()
			return slices.Equal(got.Rows, want) && slices.Equal(got.Lanes, want)
		})
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("rows and lanes, as last read: %+v", got)
		}
	})
	shows("all four leases", "default/nightly", "team-a/payments-batch", "team-a/reports", "team-b/payments-sync")

	// The namespace typed as an operator would.
	if err := chromedp.Do(tab, chromedp.SendKeys(chromedp.ID("f-ns"), "team-a")); err != nil {
		t.Fatal(err)
	}
	shows("team-a's leases", "team-a/payments-batch", "team-a/reports")
	setField(t, tab, "f-labels", "team=pay")
	shows("team-a's leases labelled team=pay", "team-a/payments-batch")
	if q := pageQuery(tab); q["ns"] != "team-a" || q["labels"] != "team=pay" {
		t.Errorf("address query: got = %v, expected: ns=team-a and labels=team=pay", q)
	}
	if got := pageEval[string](tab, `document.getElementById("count").textContent`); got != "1 lease" {
		t.Errorf("count: got = %q, expected: %q", got, "1 lease")
	}
	setField(t, tab, "f-ns", "")
	shows("every lease labelled team=pay", "team-a/payments-batch", "team-b/payments-sync")
	for _, c := range []struct {
		q    string
		want []string
	}{
		{"sync", []string{"team-b/payments-sync"}},      // a name
		{"ALICE", []string{"team-a/payments-batch"}},    // a holder, in any case
		{"10.0.0.1", []string{"team-a/payments-batch"}}, // a value
		{"", []string{"team-a/payments-batch", "team-b/payments-sync"}},
	} {
		setField(t, tab, "f-q", c.q)
		shows(fmt.Sprintf("the leases matching %q", c.q), c.want...)
	}

	// A shared link opens the same view.
	setField(t, tab, "f-q", "bob")
	shows("bob's leases labelled team=pay", "team-b/payments-sync")
	link := pageEval[string](tab, `location.href`)
	if q := pageQuery(tab); q["labels"] != "team=pay" || q["q"] != "bob" || q["window"] != "all" || q["ns"] != "" {
		t.Errorf("address query: got = %v, expected: labels=team=pay, q=bob, window=all and no ns", q)
	}
	other := newTab(t, ctx, browser)
	if _, err := chromedp.Run(other, chromedp.Navigate(link)); err != nil {
		t.Fatal(err)
	}
	tab = other
	shows("the shared view", "team-b/payments-sync")
	fields := pageEval[[]string](tab, `["f-ns", "f-labels", "f-q"].map(id => document.getElementById(id).value)`)
	if !slices.Equal(fields, []string{"", "team=pay", "bob"}) {
		t.Errorf("filter fields of the shared view: got = %q, expected: [\"\" \"team=pay\" \"bob\"]", fields)
	}

	// A selector the server refuses.
	setField(t, tab, "f-labels", "team=pay,,tier")
	var said, status string
	within(t, 20*time.Second, "the refused selector by the filters, and no rows", func() bool {
		said = pageEval[string](tab, `document.getElementById("filter-error").textContent`)
		status = pageEval[string](tab, `document.getElementById("status").textContent`)
		got = read()
		return strings.Contains(said, "empty term") && len(got.Rows) == 0 && strings.HasPrefix(status, "revision ")
	})
}

// TestWebPageDetailShowsALease: a click on a lease's row opens its
// detail: the holder with its token and value, the waiters in queue
// order, the labels, preferred holder and max hold, and the lease's
// recent events from the watch history, newest first. The address names
// the lease, and the holder's expiry counts down by itself every second.
func TestWebPageDetailShowsALease(t *testing.T) {
	browser := chromium(t)
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	c, err := client.New(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	alice := jsonOpenSession(t, ctx, addr, "alice", "60s")
	token := jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": alice, "name": "payments-batch", "value": "batch 0412",
		"labels": map[string]string{"team": "pay", "tier": "gold"}, "maxHold": "3600s"})
	if _, err := c.SetPreferredHolder(ctx, "default", "payments-batch", "dave"); err != nil {
		t.Fatal(err)
	}
	// bob and then carol queue; they stop waiting when the test ends.
	waitCtx, stopWaiting := context.WithCancel(ctx)
	var waits sync.WaitGroup
	defer waits.Wait()
	defer stopWaiting()
	for i, who := range []string{"bob", "carol"} {
		s, err := c.NewSession(ctx, client.WithIdentity(who), client.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(context.Background())
		waits.Add(1)
		go func() {
			defer waits.Done()
			_ = s.Mutex("payments-batch").Lock(waitCtx)
		}()
		within(t, 20*time.Second, who+" in the queue", func() bool { return len(jsonWaiters(t, ctx, addr, "default", "payments-batch")) == i+1 })
	}

	tab := newTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(`#leases tr[data-lease="default/payments-batch"]`))); err != nil {
		t.Fatal(err)
	}
	type detail struct {
		Title, Holders, Labels, Preferred, MaxHold string
		Waiters, Events                            []string
	}
	var d detail
	readDetail := func() detail {
		return pageEval[detail](tab, `(() => {
			const text = id => { const e = document.getElementById(id); return e ? e.innerText : ""; };
			return {Title: text("d-title"), Holders: text("d-holders"), Labels: text("d-labels"), Preferred: text("d-preferred"),
				MaxHold: text("d-maxhold"),
				Waiters: [...document.querySelectorAll("#d-waiters li")].map(li => li.innerText),
				Events: [...document.querySelectorAll("#d-events li")].map(li => li.innerText)};
		})()`)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("detail: %+v", d)
		}
	})
	within(t, 20*time.Second, "the detail with its holder, two waiters and four events", func() bool {
		d = readDetail()
		return d.Title == "default/payments-batch" && strings.Contains(d.Holders, "alice") && len(d.Waiters) == 2 && len(d.Events) == 4
	})
	tok := strconv.FormatInt(token, 10)
	for _, c := range []struct{ what, got, want string }{
		{"holders", d.Holders, "alice\t" + tok + "\t"},
		{"holders", d.Holders, "batch 0412"},
		{"first waiter", d.Waiters[0], "bob (session "},
		{"second waiter", d.Waiters[1], "carol (session "},
		{"labels", d.Labels, "team=pay"},
		{"labels", d.Labels, "tier=gold"},
		{"preferred holder", d.Preferred, "dave"},
		{"max hold", d.MaxHold, "60m"},
		{"newest event", d.Events[0], "waiting carol"},
		{"second event", d.Events[1], "waiting bob"},
		{"third event", d.Events[2], "preferred holder set dave"},
		{"oldest event", d.Events[3], "acquired alice token " + tok + " value=batch 0412"},
	} {
		if !strings.HasPrefix(c.got, c.want) && !strings.Contains(c.got, c.want) {
			t.Errorf("%s: got = %q, expected: it to contain %q", c.what, c.got, c.want)
		}
	}
	if q := pageQuery(tab); q["lease"] != "default/payments-batch" {
		t.Errorf("address query: got = %v, expected: lease=default/payments-batch", q)
	}

	// alice never heartbeats: her expiry only counts down, by itself,
	// every second. (Each reading may be up to a second old.)
	expires := func() int {
		s := pageEval[string](tab, `document.querySelector('#leases tr[data-lease="default/payments-batch"] td:nth-child(7)').innerText`)
		n, err := strconv.Atoi(strings.TrimSuffix(s, "s"))
		if err != nil {
			return -1
		}
		return n
	}
	first := expires()
	time.Sleep(2100 * time.Millisecond)
	if second := expires(); first < 50 || first > 60 || second >= first || second < first-4 {
		t.Errorf("expires in: got = %ds then %ds 2.1s later, expected: under 60s, counting down by 1 to 4", first, second)
	}

	// Esc closes it, and the address forgets it.
	if err := chromedp.Do(tab, chromedp.KeyEvent("\x1b")); err != nil {
		t.Fatal(err)
	}
	within(t, 5*time.Second, "the detail closed", func() bool {
		return pageEval[bool](tab, `document.getElementById("detail").hidden`) && pageQuery(tab)["lease"] == ""
	})
}

// webRevokePolicy: holder-a locks in team-a, ops-a administers team-a,
// viewer-a only reads it.
const webRevokePolicy = `
principals:
  - name: holder-a
    roles: [holder-a]
    tokens: [{sha256: "%s"}]
  - name: ops-a
    roles: [ops-a]
    tokens: [{sha256: "%s"}]
  - name: viewer-a
    roles: [viewer-a]
    tokens: [{sha256: "%s"}]
roles:
  holder-a:
    - namespaces: [team-a]
      verbs: [read, lock]
  ops-a:
    - namespaces: [team-a]
      verbs: [read, admin]
  viewer-a:
    - namespaces: [team-a]
      verbs: [read]
`

// TestWebPageRevokesForAnAdminOnly: from the detail view, a revoke asks
// for confirmation, then goes to the server with the token pasted in the
// page. viewer-a's is refused, and the page says "permission denied"
// while the grant stands; ops-a's revokes the grant, with its reason,
// which the table, the timeline and the events then show.
func TestWebPageRevokesForAnAdminOnly(t *testing.T) {
	browser := chromium(t)
	holder, ops, viewer := auth.NewToken(), auth.NewToken(), auth.NewToken()
	addr := testserver.StartWithPolicy(t, testserver.Limits(),
		fmt.Sprintf(webRevokePolicy, auth.HashToken(holder), auth.HashToken(ops), auth.HashToken(viewer)))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	c, err := client.New(ctx, []string{addr}, client.WithToken(holder))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithTTL(10*time.Second)) // holding as "holder-a"
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	m := s.Mutex("payments-batch", client.WithNamespace("team-a"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	tok, _ := m.Token()
	token := strconv.FormatInt(tok.Token, 10)
	const key = "team-a/payments-batch"

	tab := newTab(t, ctx, browser)
	// Wide enough for the detail to open beside the page, not over the
	// token field.
	if err := chromedp.Do(tab, chromedp.EmulateViewport(1440, 900)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/?window=all")); err != nil {
		t.Fatal(err)
	}
	result := func() string { return pageEval[string](tab, `document.getElementById("r-result").innerText`) }
	// revokeAs pastes the token, confirms a revoke of every grant with
	// reason, and returns what the page says of it.
	revokeAs := func(who, bearer, reason string) string {
		t.Helper()
		if err := chromedp.Do(tab,
			chromedp.SendKeys(chromedp.ID("token"), bearer),
			chromedp.Click(chromedp.ID("use-token")),
		); err != nil {
			t.Fatal(err)
		}
		within(t, 20*time.Second, who+" seeing the lease", func() bool {
			return pageLease(pageLeases(tab), "team-a", "payments-batch") != nil
		})
		if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(`#leases tr[data-lease="`+key+`"]`))); err != nil {
			t.Fatal(err)
		}
		var body string
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("detail as %s saw it: %q", who, body)
			}
		})
		within(t, 20*time.Second, who+" seeing holder-a's grant in the detail", func() bool {
			body = pageEval[string](tab, `document.getElementById("d-body").innerText`)
			if body == "" {
				// The click can land on a row the refresh just replaced
				// (rows are redrawn as data arrives): click the new one.
				_ = chromedp.Do(tab, chromedp.Click(chromedp.CSS(`#leases tr[data-lease="`+key+`"]`), chromedp.NodeVisible))
			}
			return strings.Contains(body, "holder-a\t"+token)
		})
		setField(t, tab, "r-reason", reason)
		if err := chromedp.Do(tab, chromedp.Click(chromedp.ID("r-start"))); err != nil {
			t.Fatal(err)
		}
		question := pageEval[string](tab, `document.getElementById("r-confirm").hidden ? "" : document.getElementById("r-question").innerText`)
		if !strings.Contains(question, "Revoke every grant of "+key) || !strings.Contains(question, reason) {
			t.Errorf("confirmation: got = %q, expected: it to name %s and the reason %q", question, key, reason)
		}
		if err := chromedp.Do(tab, chromedp.Click(chromedp.ID("r-yes"))); err != nil {
			t.Fatal(err)
		}
		var said string
		within(t, 20*time.Second, "the revoke's outcome", func() bool {
			said = result()
			return said != "" && said != "Revoking…"
		})
		return said
	}

	said := revokeAs("viewer-a", viewer, "viewer tries")
	if !strings.Contains(said, "permission denied") || !pageEval[bool](tab, `document.getElementById("r-result").classList.contains("refused")`) {
		t.Errorf("revoke as viewer-a: got = %q, expected: permission denied, marked as refused", said)
	}
	if !m.Valid() {
		t.Fatalf("holder-a's grant ended after a refused revoke")
	}

	if err := chromedp.Do(tab, chromedp.Click(chromedp.ID("forget-token"))); err != nil {
		t.Fatal(err)
	}
	said = revokeAs("ops-a", ops, "stuck since 03:00")
	if want := "Revoked token " + token; !strings.HasPrefix(said, want) {
		t.Errorf("revoke as ops-a: got = %q, expected: %q…", said, want)
	}
	select {
	case <-m.Lost():
	case <-ctx.Done():
		t.Fatal("holder-a never heard of the revoke")
	}
	var row map[string]string
	var lane *pageLane
	within(t, 20*time.Second, "the revoke in the table, the timeline and the events", func() bool {
		row = pageLease(pageLeases(tab), "team-a", "payments-batch")
		lane = readLane(tab, key)
		return row != nil && strings.HasPrefix(row["Status"], "Revoked ") && strings.Contains(row["Status title"], "stuck since 03:00") &&
			lane != nil && len(lane.Bars) == 1 && strings.Contains(lane.Bars[0].Class, "end-revoked") && slices.Contains(lane.Marks, "revoked") &&
			strings.Contains(pageEval[string](tab, `document.getElementById("d-events").innerText`), "revoked holder-a token "+token+" (stuck since 03:00)")
	})
	if text := pointAt(t, tab, key, ".tl-mark.revoked", false); !strings.Contains(text, "holder-a's grant (token "+token+") revoked") ||
		!strings.Contains(text, "reason: stuck since 03:00") {
		t.Errorf("revoke mark: got = %q, expected: holder-a, its token and the reason", text)
	}
}

// acquireMany makes n leases held by session through the JSON API, 32
// calls at a time: ns-<i mod 10>/lease-<i>, labelled, each with a value.
func acquireMany(ctx context.Context, addr string, session int64, n int) error {
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var next atomic.Int64
	var wg sync.WaitGroup
	failed := make(chan error, 1)
	for range 32 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				body := fmt.Sprintf(`{"sessionId":"%d","namespace":"ns-%d","name":"lease-%05d","value":"10.0.%d.%d:8080",`+
					`"labels":{"team":"team-%d","tier":"t%d"}}`, session, i%10, i, i/256%256, i%256, i%37, i%3)
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/tenure.v1.LeaseService/Acquire", strings.NewReader(body))
				var resp *http.Response
				if err == nil {
					req.Header.Set("Content-Type", "application/json")
					resp, err = hc.Do(req)
				}
				if err == nil {
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("acquire %s: %s", body, resp.Status)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil {
					select {
					case failed <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-failed:
		return err
	default:
		return nil
	}
}

// webScrollSteps is how many jumps across the table and the lanes the
// 10,000-lease test makes, timing each.
const webScrollSteps = 40

// TestWebPageWithTenThousandLeases loads 10,000 held leases: the table
// and the timeline draw only what is in view, a scroll to the end brings
// the last lease in, and the search narrows them. It asserts bounds,
// never times; it logs what the page measured of itself (tenurePerf)
// and the time from each scroll to the next painted frame, the figures
// of docs/benchmarks.md ("The web page"), which come from a run without
// -race.
func TestWebPageWithTenThousandLeases(t *testing.T) {
	browser := chromium(t)
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const n = 10000
	start := time.Now()
	if err := acquireMany(ctx, addr, jsonOpenSession(t, ctx, addr, "bulk", "600s"), n); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d leases acquired in %v", n, time.Since(start).Round(time.Millisecond))

	tab := newTab(t, ctx, browser)
	if err := chromedp.Do(tab, chromedp.EmulateViewport(1440, 1000)); err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	type drawn struct {
		Count, Range string
		Rows, Lanes  []string
	}
	var d drawn
	read := func() drawn {
		return pageEval[drawn](tab, `({
			Count: document.getElementById("count").textContent,
			Range: document.getElementById("tl-range").textContent,
			Rows: [...document.querySelectorAll("#leases tbody tr[data-lease]")].map(r => r.dataset.lease),
			Lanes: [...document.querySelectorAll(".tl-lane")].map(l => l.dataset.lease),
		})`)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("as last read: count %q, range %q, %d rows from %q, %d lanes", d.Count, d.Range, len(d.Rows), d.Rows[:min(len(d.Rows), 1)], len(d.Lanes))
		}
	})
	// bounded: a page of rows and lanes, not thousands.
	bounded := func() bool { return len(d.Rows) > 10 && len(d.Rows) <= 100 && len(d.Lanes) > 5 && len(d.Lanes) <= 60 }
	within(t, 90*time.Second, "10000 leases listed, their first rows and lanes drawn", func() bool {
		d = read()
		return d.Count == "10000 leases" && strings.Contains(d.Range, "10000 lanes") && bounded() &&
			d.Rows[0] == "ns-0/lease-00000" && d.Lanes[0] == "ns-0/lease-00000"
	})
	t.Logf("navigation to the first rows drawn: %v (as the test saw it)", time.Since(opened).Round(time.Millisecond))

	// To the end of the table, then of the lanes.
	if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](`(() => {
		const box = document.getElementById("lease-scroll");
		box.scrollTop = box.scrollHeight;
		return true;
	})()`)); err != nil {
		t.Fatal(err)
	}
	within(t, 20*time.Second, "the last lease's row after a scroll to the end", func() bool {
		d = read()
		return bounded() && d.Rows[len(d.Rows)-1] == "ns-9/lease-09999"
	})
	if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](`(() => {
		const box = document.getElementById("tl-lanes");
		box.scrollTop = box.scrollHeight;
		return true;
	})()`)); err != nil {
		t.Fatal(err)
	}
	within(t, 20*time.Second, "the last lease's lane after a scroll to the end", func() bool {
		d = read()
		return bounded() && d.Lanes[len(d.Lanes)-1] == "ns-9/lease-09999"
	})

	// Jumps across both, each timed from the scroll to the second frame
	// after it: the page draws in the first.
	type timing struct {
		Rows, Lanes []float64 // scroll → painted, ms
	}
	tm, err := chromedp.Run(tab, chromedp.Evaluate[timing](`(async () => {
		const frame = () => new Promise(done => requestAnimationFrame(() => done()));
		const jump = async box => {
			const times = [];
			const most = box.scrollHeight - box.clientHeight;
			for (let i = 1; i <= `+strconv.Itoa(webScrollSteps)+`; i++) {
				await frame();
				const t0 = performance.now();
				box.scrollTop = (i * 0.618034 % 1) * most;
				await frame();
				await frame();
				times.push(performance.now() - t0);
			}
			return times;
		};
		return {Rows: await jump(document.getElementById("lease-scroll")), Lanes: await jump(document.getElementById("tl-lanes"))};
	})()`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	d = read()
	if !bounded() {
		t.Errorf("after %d jumps: %d rows and %d lanes drawn, expected: at most 100 and 60", webScrollSteps, len(d.Rows), len(d.Lanes))
	}

	// A revoke is an event: the page fetches that one lease again, not
	// all 10,000. On a busy machine the page may still be catching up
	// with the 10,000 acquires (a List after its watch fell behind is
	// right), so the check starts once it has caught up: the store's
	// revision shown, nothing dirty, no fetch running. The page's own
	// safety net (a List every 30s, or 20 Lists' time, past 1,000
	// leases) is held off: it is not the revoke's doing.
	var kv struct {
		Revision string `json:"revision"`
	}
	jsonCall(t, ctx, addr, "KVService/Range", map[string]any{"limit": 1}, &kv)
	within(t, 60*time.Second, "the page to catch up with revision "+kv.Revision, func() bool {
		return pageEval[bool](tab, `(() => {
			const m = /revision (\d+)/.exec(document.getElementById("status").textContent);
			return !!m && +m[1] >= `+kv.Revision+` && dirty.size === 0 && !leases.busy;
		})()`)
	})
	pageEval[bool](tab, `leases.lastList = Date.now() + 3600e3, performance.setResourceTimingBufferSize(100000), performance.clearResourceTimings(), true`)
	jsonCall(t, ctx, addr, "LeaseService/Revoke", map[string]any{"namespace": "ns-0", "name": "lease-00000", "reason": "test"}, nil)
	if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](`document.getElementById("lease-scroll").scrollTop = 0, true`)); err != nil {
		t.Fatal(err)
	}
	var row map[string]string
	within(t, 20*time.Second, "lease-00000 revoked in its row", func() bool {
		row = pageLease(pageLeases(tab), "ns-0", "lease-00000")
		return row != nil && strings.HasPrefix(row["Status"], "Revoked ")
	})
	type calls struct{ Lists, Gets int }
	fetched := pageEval[calls](tab, `(() => {
		const calls = performance.getEntriesByType("resource").map(e => e.name);
		return {Lists: calls.filter(n => n.endsWith("LeaseService/List")).length, Gets: calls.filter(n => n.endsWith("LeaseService/Get")).length};
	})()`)
	if fetched.Lists != 0 || fetched.Gets < 1 {
		t.Errorf("fetches after the revoke: got = %d Lists and %d Gets, expected: no List, a Get", fetched.Lists, fetched.Gets)
	}

	// The search narrows 10,000 to one.
	setField(t, tab, "f-q", "lease-04242")
	within(t, 20*time.Second, "the one lease the search finds", func() bool {
		d = read()
		return d.Count == "1 of 10000 leases" && slices.Equal(d.Rows, []string{"ns-2/lease-04242"}) && slices.Equal(d.Lanes, d.Rows)
	})

	type self struct {
		Leases, ListBytes, ReplayedEvents                         int
		FetchMs, ParseMs, TableMs, PaintedMs, PaintedAt, ReplayMs float64
		RowsMs, LanesMs                                           []float64
	}
	p := pageEval[self](tab, `(() => {
		const p = window.tenurePerf;
		return {Leases: p.leases, ListBytes: p.listBytes, ReplayedEvents: p.replayedEvents || 0, FetchMs: p.fetchMs,
			ParseMs: p.parseMs, TableMs: p.tableMs, PaintedMs: p.paintedMs, PaintedAt: p.paintedAt, ReplayMs: p.replayMs || 0,
			RowsMs: p.rowsMs, LanesMs: p.lanesMs};
	})()`)
	t.Logf("List of %d leases (%d KB of JSON): fetched in %.0f ms, parsed in %.0f ms; table built in %.0f ms, painted %.0f ms after the answer; "+
		"%.0f ms from navigation start to the painted table", p.Leases, p.ListBytes/1024, p.FetchMs, p.ParseMs, p.TableMs, p.PaintedMs, p.PaintedAt)
	t.Logf("watch replay: %d events in %.0f ms", p.ReplayedEvents, p.ReplayMs)
	t.Logf("scroll to painted, %d jumps across the table: %s", webScrollSteps, spread(tm.Rows))
	t.Logf("scroll to painted, %d jumps across the lanes: %s", webScrollSteps, spread(tm.Lanes))
	t.Logf("drawing the rows in view: %s; the lanes in view: %s", spread(p.RowsMs), spread(p.LanesMs))
	t.Logf("elements in the page: %d", pageEval[int](tab, `document.getElementsByTagName("*").length`))
}

// spread is the median, 95th percentile and maximum of ms.
func spread(ms []float64) string {
	if len(ms) == 0 {
		return "no samples"
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	at := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return fmt.Sprintf("median %.1f ms, p95 %.1f ms, max %.1f ms (%d samples)", at(0.5), at(0.95), s[len(s)-1], len(s))
}

// TestWebPageTimelineStartsAtTheOldestEventKept: on a server that keeps
// only its last 16 events, the page asks for revision 1, is told the
// oldest it may have, and replays from there. The timeline says where
// its history begins and hatches the time before; a grant older than the
// history is drawn from the lease list, from its acquire time, and the
// churn of another lease shows only as far back as the history goes.
func TestWebPageTimelineStartsAtTheOldestEventKept(t *testing.T) {
	browser := chromium(t)
	limits := testserver.Limits()
	limits.WatchHistory = 16
	addr := testserver.Start(t, limits)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	alice := jsonOpenSession(t, ctx, addr, "alice", "60s")
	oldToken := jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": alice, "name": "old-grant"})
	bob := jsonOpenSession(t, ctx, addr, "bob", "60s")
	for range 20 {
		tok := jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": bob, "name": "churn"})
		jsonCall(t, ctx, addr, "LeaseService/Release", map[string]any{"name": "churn", "token": tok}, nil)
	}

	tab := newTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/?window=all")); err != nil {
		t.Fatal(err)
	}
	history := regexp.MustCompile(`history from revision (\d+) \(`)
	var rangeText string
	var old, churn *pageLane
	within(t, 20*time.Second, "both lanes, from the oldest revision kept", func() bool {
		rangeText = pageEval[string](tab, `document.getElementById("tl-range").textContent`)
		old, churn = readLane(tab, "default/old-grant"), readLane(tab, "default/churn")
		return history.MatchString(rangeText) && old != nil && len(old.Bars) == 1 && churn != nil && len(churn.Bars) >= 7
	})
	if m := history.FindStringSubmatch(rangeText); m[1] == "1" || strings.Contains(rangeText, "(all of it)") {
		t.Errorf("timeline range: got = %q, expected: a history that starts after revision 1", rangeText)
	}
	if b := old.Bars[0]; b.Holder != "alice" || b.Token != strconv.FormatInt(oldToken, 10) || !strings.Contains(b.Class, "open") ||
		strings.Contains(b.Class, "before") {
		t.Errorf("old-grant's bar: got = %+v, expected: alice's, still held, from its acquire time", b)
	}
	if len(churn.Bars) > 8 {
		t.Errorf("churn's bars: got = %d, expected: at most the 8 grants 16 events hold", len(churn.Bars))
	}
	if !pageEval[bool](tab, `!!document.querySelector('.tl-lane[data-lease="default/churn"] .tl-nohist')`) {
		t.Errorf("churn's lane: no hatching before the history, expected some")
	}
}

// TestWebPageTimelineFitsAYoungHistoryAndWritesOneClock: on a server
// whose history is 20 seconds old, the timeline opened on its default
// window (up to 15 minutes) fits those 20 seconds, so a grant held all
// along spans most of the width rather than a sliver at the right edge.
// A holder identity too long for its column is whole in the tooltips of
// the row and the bar. And every moment the page writes — the status
// line, the range above the lanes, the recent events, the tooltips and
// the detail — is in one format: local time to the millisecond, after
// the date only when that is not today.
func TestWebPageTimelineFitsAYoungHistoryAndWritesOneClock(t *testing.T) {
	browser := chromium(t)
	addr := testserver.Start(t, testserver.Limits())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const long = "payments-scheduler-replica-7f9c2d1e-eu-west-1b.prod.internal.example.com"
	const key = "default/report"
	born := time.Now()
	done := jsonOpenSession(t, ctx, addr, "cron-1", "60s")
	tok := jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": done, "name": "nightly"})
	jsonCall(t, ctx, addr, "LeaseService/Release", map[string]any{"name": "nightly", "token": tok}, nil)
	holder := jsonOpenSession(t, ctx, addr, long, "60s")
	token := strconv.FormatInt(jsonAcquireWith(t, ctx, addr, map[string]any{"sessionId": holder, "name": "report"}), 10)
	// The session is not heartbeated: it must outlive the test.
	time.Sleep(time.Until(born.Add(20 * time.Second)))

	tab := newTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	var lane *pageLane
	within(t, 20*time.Second, "the report lane with its grant", func() bool {
		lane = readLane(tab, key)
		return lane != nil && len(lane.Bars) == 1
	})
	// 20s of a 15-minute window would be 2% of it.
	if b := lane.Bars[0]; b.Holder != long || b.Token != token || b.Width < 80 {
		t.Errorf("report's bar on a 20s-old history: got = %+v, expected: %s's token %s, over 80%% of the window", b, long, token)
	}

	// Long identities: cut short in the row, whole in its tooltip and in
	// the bar's.
	var row map[string]string
	within(t, 20*time.Second, "the report row", func() bool {
		row = pageLease(pageLeases(tab), "default", "report")
		return row != nil
	})
	if cut := pageEval[bool](tab, `(() => {
		const tr = document.querySelector('#leases tr[data-lease="default/report"]');
		const td = tr && tr.cells[2];
		return !!td && td.scrollWidth > td.clientWidth;
	})()`); !cut {
		t.Logf("the Holder cell shows %s whole at this width; its tooltip is checked all the same", long)
	}
	if !strings.Contains(row["Holder title"], long) {
		t.Errorf("Holder tooltip: got = %q, expected: the whole identity %q", row["Holder title"], long)
	}
	tip := pointAt(t, tab, key, ".tl-bar", false)
	if !strings.Contains(tip, long+", token "+token) {
		t.Errorf("bar's tooltip: got = %q, expected: the whole identity %q and token %s", tip, long, token)
	}

	// One clock format everywhere.
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(`#leases tr[data-lease="default/report"]`))); err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{}
	within(t, 20*time.Second, "the page's times", func() bool {
		texts = pageEval[map[string]string](tab, `(() => {
			const text = id => document.getElementById(id).innerText;
			const nightly = document.querySelector('#leases tr[data-lease="default/nightly"]');
			const report = document.querySelector('#d-holders tbody tr');
			return {
				status: text("status"), range: text("tl-range"), events: text("events"), detailEvents: text("d-events"),
				nightlyStatus: nightly ? nightly.cells[3].title : "",
				heldSince: report ? report.cells[2].title + "\n" + report.cells[3].title : "",
			};
		})()`)
		return strings.Contains(texts["status"], "updated") && texts["nightlyStatus"] != "" && texts["heldSince"] != "" &&
			strings.Contains(texts["events"], "acquired "+key) && strings.Contains(texts["detailEvents"], "acquired")
	})
	texts["bar tooltip"] = tip
	// Any time of day, with what may come around it: a date, seconds,
	// a fraction, a zone, AM or PM.
	anyTime := regexp.MustCompile(`(\d{4}-\d{2}-\d{2}[T ])?\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?( ?[AaPp]\.?[Mm]\.?|Z|[+-]\d{2}:?\d{2})?`)
	one := regexp.MustCompile(`^(\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}\.\d{3}$`)
	for what, text := range texts {
		found := anyTime.FindAllString(text, -1)
		if len(found) == 0 {
			t.Errorf("%s: got = %q, expected: a time in it", what, text)
		}
		for _, s := range found {
			if !one.MatchString(s) {
				t.Errorf("%s: got = time %q in %q, expected: HH:MM:SS.mmm, after YYYY-MM-DD when not today", what, s, text)
			}
		}
	}
}

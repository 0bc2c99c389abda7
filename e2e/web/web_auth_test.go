package web

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/e2etest"
	"github.com/tenurehq/tenure/internal/testserver"
)

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
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
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
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
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
		e2etest.Within(t, 20*time.Second, who+" seeing the lease", func() bool {
			return pageLease(pageLeases(tab), "team-a", "payments-batch") != nil
		})
		clickRow(t, tab, `#leases tr[data-lease="`+key+`"]`)
		var body string
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("detail as %s saw it: %q", who, body)
			}
		})
		e2etest.Within(t, 20*time.Second, who+" seeing holder-a's grant in the detail", func() bool {
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
		e2etest.Within(t, 20*time.Second, "the revoke's outcome", func() bool {
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
	e2etest.Within(t, 20*time.Second, "the revoke in the table, the timeline and the events", func() bool {
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

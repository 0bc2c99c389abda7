package web

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/e2etest"
	"github.com/tenurehq/tenure/internal/testserver"
)

// TestWebPageShowsWhoHoldsWhatAndFollowsChanges opens the page in headless
// Chromium, as an operator would, and checks that it shows the holder of
// a lease, its token and a waiter ("Held, 1 waiting"), then updates by
// itself when the lease changes hands.
func TestWebPageShowsWhoHoldsWhatAndFollowsChanges(t *testing.T) {
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)

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

// TestWebPageShowsHowEachLeaseEnded: once nobody holds a lease, the page
// says how its last grant ended and how long ago, like `tenure get
// leases` — "Released 3s ago" for a lease its holder unlocked, "Expired
// 1s ago" for one whose holder's session ran out — and names that last
// holder in the Holder column, so an operator sees who had it. The expiry
// is made through the JSON API: a session opened with a 1s TTL that
// never heartbeats, which the Go client would not allow.
func TestWebPageShowsHowEachLeaseEnded(t *testing.T) {
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
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
	e2etest.Within(t, 20*time.Second, "page showing nightly-report released and payments-batch expired", func() bool {
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
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
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
		e2etest.Within(t, 20*time.Second, "page showing "+what, func() bool {
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
	e2etest.Within(t, 20*time.Second, "the preference and the step-down in the events", func() bool {
		events, _ = chromedp.Run(tab, chromedp.Evaluate[string](`document.getElementById("events").innerText`))
		return strings.Contains(events, "preferred holder set default/scheduler holder=sched-2") &&
			strings.Contains(events, "step down default/scheduler holder=sched-1")
	})
}

// TestWebPageFiltersNarrowTheLeasesAndStayInTheAddress: the namespace
// and label selector go to the server's List, the search text matches
// names, holders and values, and each narrows the lease table and the
// timeline's lanes alike. The address carries the filters, so that the
// same view opens from a shared link; a selector the server refuses is
// shown by the filters, not as a server failure.
func TestWebPageFiltersNarrowTheLeasesAndStayInTheAddress(t *testing.T) {
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
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
		e2etest.Within(t, 20*time.Second, what, func() bool {
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
	other := e2etest.NewTab(t, ctx, browser)
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
	e2etest.Within(t, 20*time.Second, "the refused selector by the filters, and no rows", func() bool {
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
	browser := e2etest.Chromium(t)
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
		e2etest.Within(t, 20*time.Second, who+" in the queue", func() bool { return len(jsonWaiters(t, ctx, addr, "default", "payments-batch")) == i+1 })
	}

	tab := e2etest.NewTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	clickRow(t, tab, `#leases tr[data-lease="default/payments-batch"]`)
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
	e2etest.Within(t, 20*time.Second, "the detail with its holder, two waiters and four events", func() bool {
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
	e2etest.Within(t, 5*time.Second, "the detail closed", func() bool {
		return pageEval[bool](tab, `document.getElementById("detail").hidden`) && pageQuery(tab)["lease"] == ""
	})
}

package web

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/e2etest"
	"github.com/tenurehq/tenure/internal/testserver"
)

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
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
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
	e2etest.Within(t, 20*time.Second, "bob in the queue", func() bool { return len(jsonWaiters(t, ctx, addr, "default", "payments-batch")) == 1 })
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
	e2etest.Within(t, 20*time.Second, "the handover drawn live: alice's bar, then bob's, a handoff mark", handedOver)

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
		clickRow(t, tab, `#leases tr[data-lease="default/nightly-report"]`)
		time.Sleep(300 * time.Millisecond)
		writeScreenshot(t, tab, "web-detail.png")
	}

	// Opened again, the page knows only what the watch replays.
	if _, err := chromedp.Run(tab, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	e2etest.Within(t, 20*time.Second, "the same handover drawn from the replayed history", handedOver)
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
		e2etest.Within(t, 10*time.Second, who+" waiting", func() bool {
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

// TestWebPageTimelineStartsAtTheOldestEventKept: on a server that keeps
// only its last 16 events, the page asks for revision 1, is told the
// oldest it may have, and replays from there. The timeline says where
// its history begins and hatches the time before; a grant older than the
// history is drawn from the lease list, from its acquire time, and the
// churn of another lease shows only as far back as the history goes.
func TestWebPageTimelineStartsAtTheOldestEventKept(t *testing.T) {
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/?window=all")); err != nil {
		t.Fatal(err)
	}
	history := regexp.MustCompile(`history from revision (\d+) \(`)
	var rangeText string
	var old, churn *pageLane
	e2etest.Within(t, 20*time.Second, "both lanes, from the oldest revision kept", func() bool {
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
	t.Parallel() // its own server and browser; it waits 20s for its history to age
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+addr+"/")); err != nil {
		t.Fatal(err)
	}
	var lane *pageLane
	e2etest.Within(t, 20*time.Second, "the report lane with its grant", func() bool {
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
	e2etest.Within(t, 20*time.Second, "the report row", func() bool {
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
	clickRow(t, tab, `#leases tr[data-lease="default/report"]`)
	texts := map[string]string{}
	e2etest.Within(t, 20*time.Second, "the page's times", func() bool {
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

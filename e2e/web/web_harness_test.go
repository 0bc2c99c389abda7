package web

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

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
// waitForRow waits up to 20 s for the page's lease row namespace/name
// to satisfy ok, and fails naming what it waited for and the row.
func waitForRow(t *testing.T, tab context.Context, namespace, name, what string, ok func(row map[string]string) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		row := pageLease(pageLeases(tab), namespace, name)
		if ok(row) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("page never showed %s; %s row: %q", what, name, row)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

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
	path := filepath.Join("..", "..", "docs", "img", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// clickRow clicks the element sel finds, a row of the lease table. The
// page redraws its rows as data arrives, and a click whose node the
// redraw replaced between its lookup and the click fails with "Could not
// find node with given id" before any mouse event is sent: that click is
// made again, on the new row, for up to 20s. Any other error fails the
// test at once.
func clickRow(t *testing.T, tab context.Context, sel string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := chromedp.Do(tab, chromedp.Click(chromedp.CSS(sel)))
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "Could not find node with given id") || time.Now().After(deadline) {
			t.Fatalf("click %s: %v", sel, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package web

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/internal/e2etest"
	"github.com/tenurehq/tenure/server"
)

// TestWebPageShowsEtcdLocks: an etcd Mutex held by one session and
// awaited by another shows on the page as a row of namespace (etcd):
// the holder's identity and etcd lease in hex, the create revision of
// its key as the token, one waiter. When the holder's session closes,
// the row follows by itself, from the lease watch's etcd-lock events:
// the page's periodic List is put off for the test, so nothing else can
// bring the change.
func TestWebPageShowsEtcdLocks(t *testing.T) {
	browser := e2etest.Chromium(t)
	c := cluster.New(t, 1, cluster.WithEtcd(server.Compaction{}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ec := c.EtcdClient(ctx)
	session := func() *concurrency.Session {
		s, err := concurrency.NewSession(ec, concurrency.WithTTL(60))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	s1, s2 := session(), session()
	m1 := concurrency.NewMutex(s1, "jobs/nightly")
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	m2 := concurrency.NewMutex(s2, "jobs/nightly")
	m2locked := make(chan error, 1)
	go func() { m2locked <- m2.Lock(ctx) }()

	tab := e2etest.NewTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+c.Node(0).Addr()+"/")); err != nil {
		t.Fatal(err)
	}
	holder := func(s *concurrency.Session) string { return fmt.Sprintf("etcd (lease %016x)", int64(s.Lease())) }
	waitForRow(t, tab, "(etcd)", "jobs/nightly", "the etcd lock held with one waiter", func(r map[string]string) bool {
		return r["Holder"] == holder(s1) && r["Token"] == strconv.FormatInt(m1.Header().Revision, 10) &&
			r["Status"] == "Held, 1 waiting" && r["Waiters"] == "1" && r["Held for"] != "" && r["Held for"] != "unknown"
	})

	// No more periodic Lists: only the watch can tell the page now.
	pageEval[any](tab, `leases.lastList = Date.now() + 3600e3`)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-m2locked; err != nil {
		t.Fatal(err)
	}
	resp, err := ec.Get(ctx, m2.Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the new holder's key: %v", err)
	}
	waitForRow(t, tab, "(etcd)", "jobs/nightly", "the handover to the waiter", func(r map[string]string) bool {
		return r["Holder"] == holder(s2) && r["Token"] == strconv.FormatInt(resp.Kvs[0].CreateRevision, 10) &&
			r["Status"] == "Held" && r["Waiters"] == "0"
	})
	// Its detail: what it is, the holder with its lease, and no revoke
	// (the lock is the etcd lease's).
	if !pageEval[bool](tab, `(() => { const tr = document.querySelector('#leases tbody tr[data-lease="(etcd)/jobs/nightly"]'); if (tr) tr.click(); return !!tr; })()`) {
		t.Fatal("no row of the etcd lock to click")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		kind := pageEval[string](tab, `(document.querySelector("#d-kind") || {}).textContent || ""`)
		holders := pageEval[string](tab, `(document.querySelector("#d-holders") || {}).innerText || ""`)
		revoke := pageEval[bool](tab, `document.querySelector("#d-revoke").hidden`)
		if strings.Contains(kind, "etcd lock") && strings.Contains(holders, holder(s2)) && revoke {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("detail of the etcd lock: got = kind %q, holders %q, revoke hidden %v, expected: an etcd lock held by %s, no revoke", kind, holders, revoke, holder(s2))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if opts := pageEval[[]string](tab, `Array.from(document.querySelectorAll("#namespaces option"), o => o.value)`); len(opts) > 0 {
		for _, o := range opts {
			if o == "(etcd)" {
				t.Errorf("the namespace filter offers (etcd), which no List accepts: %q", opts)
			}
		}
	}
}

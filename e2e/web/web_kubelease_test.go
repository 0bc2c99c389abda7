package web

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/internal/e2etest"
	"github.com/tenurehq/tenure/server"
)

// TestWebPageShowsKubernetesLeases: a Kubernetes Lease kube-apiserver
// stored shows on the page as a row of namespace
// (kubernetes)/kube-system: its holder, Held, no token, held since its
// acquireTime (90s ago), its TTL and transitions. When another holder takes it
// over, the row follows by itself, from the lease watch's Kubernetes
// Lease events (the periodic List is put off); its detail says what it
// is and offers no revoke.
func TestWebPageShowsKubernetesLeases(t *testing.T) {
	browser := e2etest.Chromium(t)
	c := cluster.New(t, 1, cluster.WithEtcd(server.Compaction{}), cluster.WithKubernetesPrefix("/registry"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ec := c.EtcdClient(ctx)
	const key = "/registry/leases/kube-system/kube-scheduler"
	now := time.Now()
	if _, err := ec.Put(ctx, key, cluster.KubeLeaseJSON("kube-system", "kube-scheduler", "node-1_a", 60, 3, now.Add(-90*time.Second), now)); err != nil {
		t.Fatal(err)
	}

	tab := e2etest.NewTab(t, ctx, browser)
	if _, err := chromedp.Run(tab, chromedp.Navigate("http://"+c.Node(0).Addr()+"/")); err != nil {
		t.Fatal(err)
	}
	waitForRow(t, tab, "(kubernetes)/kube-system", "kube-scheduler", "the Kubernetes Lease held by node-1_a", func(r map[string]string) bool {
		return r["Holder"] == "node-1_a" && r["Status"] == "Held" && r["Token"] == "—" && r["Held for"] >= "90s" && len(r["Held for"]) == 3 &&
			r["Expires in"] != "" && r["TTL"] == "60s" && r["Transitions"] == "3"
	})

	// No more periodic Lists: only the watch can tell the page now.
	pageEval[any](tab, `leases.lastList = Date.now() + 3600e3`)
	now = time.Now()
	if _, err := ec.Put(ctx, key, cluster.KubeLeaseJSON("kube-system", "kube-scheduler", "node-2_b", 60, 4, now, now)); err != nil {
		t.Fatal(err)
	}
	waitForRow(t, tab, "(kubernetes)/kube-system", "kube-scheduler", "the handover to node-2_b", func(r map[string]string) bool {
		return r["Holder"] == "node-2_b" && r["Status"] == "Held" && r["Transitions"] == "4"
	})
	if !pageEval[bool](tab, `(() => { const tr = document.querySelector('#leases tbody tr[data-lease="(kubernetes)/kube-system/kube-scheduler"]'); if (tr) tr.click(); return !!tr; })()`) {
		t.Fatal("no row of the Kubernetes Lease to click")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		kind := pageEval[string](tab, `(document.querySelector("#d-kind") || {}).textContent || ""`)
		holder := pageEval[string](tab, `(document.querySelector("#d-kube-holder") || {}).textContent || ""`)
		revoke := pageEval[bool](tab, `document.querySelector("#d-revoke").hidden`)
		if strings.Contains(kind, "Kubernetes Lease") && strings.Contains(kind, key) && strings.HasPrefix(holder, "node-2_b") && revoke {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("detail of the Kubernetes Lease: got = kind %q, holder %q, revoke hidden %v, expected: a Kubernetes Lease at %s held by node-2_b, no revoke", kind, holder, revoke, key)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, o := range pageEval[[]string](tab, `Array.from(document.querySelectorAll("#namespaces option"), o => o.value)`) {
		if strings.HasPrefix(o, "(kubernetes)") {
			t.Errorf("the namespace filter offers %q, which no List accepts", o)
		}
	}
}

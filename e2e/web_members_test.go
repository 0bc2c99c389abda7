package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tenurehq/tenure/internal/e2etest"
)

// The web page's test that needs a cluster of processes, and so this
// package's cluster harness (newClusterNodes, settled); the page's other
// tests are package e2e/web's, which go test runs beside this one.

// TestWebPageShowsTheMembers opens the page of a follower of a
// three-node cluster: it lists every member with its API address, role,
// vote and applied index, the leader marked, and shows a member that
// goes down as unreachable.
func TestWebPageShowsTheMembers(t *testing.T) {
	browser := e2etest.Chromium(t)
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

	tab := e2etest.NewTab(t, ctx, browser)
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
	e2etest.Within(t, 20*time.Second, "page listing the three members", func() bool {
		got = rows()
		return showsAll(got)
	})

	down.kill()
	e2etest.Within(t, 20*time.Second, "page showing "+down.id+" unreachable", func() bool {
		got = rows()
		return got[down.id] != nil && got[down.id][3] == "unreachable"
	})
}

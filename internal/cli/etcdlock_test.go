package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// TestGetLeaseAllNamespacesShowsEtcdLocks: `tenure get lease -A` lists
// an etcd Mutex held by one session and awaited by another, under the
// namespace "(etcd)", with its holder's identity and etcd lease in hex,
// one waiter, the holder key's create revision as TOKEN (-o wide), and
// in -o json its kind, key prefix and leases.
func TestGetLeaseAllNamespacesShowsEtcdLocks(t *testing.T) {
	c := cluster.New(t, 1, cluster.WithEtcd(server.Compaction{}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ec := c.EtcdClient(ctx)
	s1, err := concurrency.NewSession(ec, concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := concurrency.NewSession(ec, concurrency.WithTTL(60))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	m1 := concurrency.NewMutex(s1, "jobs/nightly")
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	go func() { _ = concurrency.NewMutex(s2, "jobs/nightly").Lock(ctx) }()

	ep := []string{"--endpoints", c.Node(0).Addr()}
	holder := fmt.Sprintf("etcd (lease %016x)", int64(s1.Lease()))
	row := regexp.MustCompile(`(?m)^\(etcd\)\s+jobs/nightly\s+` + regexp.QuoteMeta(holder) + `\s+Held, 1 waiting\s+\d+s\s*$`)
	var stdout string
	waitFor(t, 10*time.Second, "the etcd lock with its waiter in get lease -A", func() bool {
		var code int
		stdout, _, code = runMain(append(ep, "get", "lease", "-A")...)
		return code == 0 && row.MatchString(stdout)
	})
	t.Logf("get lease -A:\n%s", stdout)
	if !strings.HasPrefix(stdout, "NAMESPACE ") {
		t.Errorf("get lease -A: got = %q, expected: a NAMESPACE column", stdout)
	}

	wide, stderr, code := runMain(append(ep, "get", "lease", "-A", "-o", "wide")...)
	token := fmt.Sprint(m1.Header().Revision)
	if code != 0 || !regexp.MustCompile(`(?m)^\(etcd\)\s+jobs/nightly\s+`+regexp.QuoteMeta(holder)+`\s+Held, 1 waiting\s+\S+\s+`+token+`\s+1m0s\s`).MatchString(wide) {
		t.Errorf("get lease -A -o wide: got = exit %d, %q, stderr %q, expected: a row with TOKEN %s and TTL 1m0s", code, wide, stderr, token)
	}

	out, stderr, code := runMain(append(ep, "get", "lease", "-A", "-o", "json")...)
	var doc struct {
		Items []leaseDoc `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil {
		t.Fatalf("get lease -A -o json: exit %d, %v, stderr %q", code, err, stderr)
	}
	var found bool
	for _, d := range doc.Items {
		if d.Status.Kind != client.KindEtcdLock {
			continue
		}
		found = true
		if d.Metadata.Name != "jobs/nightly" || d.Status.KeyPrefix != "jobs/nightly/" || d.Status.FencingToken != m1.Header().Revision ||
			len(d.Status.Holders) != 1 || d.Status.Holders[0].EtcdLeaseID != fmt.Sprintf("%016x", int64(s1.Lease())) ||
			len(d.Status.Waiters) != 1 || d.Status.Waiters[0].EtcdLeaseID != fmt.Sprintf("%016x", int64(s2.Lease())) {
			t.Errorf("the etcd lock in -o json: got = %+v, expected: jobs/nightly held by %x at %d, %x waiting", d, int64(s1.Lease()), m1.Header().Revision, int64(s2.Lease()))
		}
	}
	if !found {
		t.Errorf("-o json has no etcd lock: %s", out)
	}

	// Not listed for a namespace: it has none.
	if out, _, _ := runMain(append(ep, "get", "lease")...); strings.Contains(out, "jobs/nightly") {
		t.Errorf("get lease (namespace default): got = %q, expected: no etcd lock", out)
	}

	// Shown alone by the namespace the list gives it; a name that is not
	// there is not found (exit 1), not a usage error.
	one, stderr, code := runMain(append(ep, "get", "lease", "-n", "(etcd)", "jobs/nightly", "-o", "wide")...)
	if code != 0 || !regexp.MustCompile(`(?m)^\(etcd\)\s+jobs/nightly\s+`+regexp.QuoteMeta(holder)+`\s+Held, 1 waiting\s+\S+\s+`+token+`\s`).MatchString(one) {
		t.Errorf("get lease -n (etcd) jobs/nightly: got = exit %d, %q, stderr %q, expected: its row", code, one, stderr)
	}
	if _, stderr, code := runMain(append(ep, "get", "lease", "-n", "(etcd)", "jobs/none")...); code != ExitUnmet || !strings.Contains(stderr, "no lease jobs/none in (etcd)") {
		t.Errorf("get lease -n (etcd) jobs/none: got = exit %d, stderr %q, expected: exit %d, not found", code, stderr, ExitUnmet)
	}
}

// An etcd lock whose holder took over before the node could see it has
// no acquire time: AGE says so rather than counting from year 1.
func TestPrintEtcdLockOfUnknownSince(t *testing.T) {
	l := client.Lease{
		Name: "m", Kind: client.KindEtcdLock, KeyPrefix: []byte("m/"), Capacity: 1, Holder: "etcd", Token: 7, Status: "held",
		Holders: []client.GrantInfo{{SessionID: 7, Holder: "etcd", Token: 7, EtcdLease: 0x694d}},
	}
	var buf bytes.Buffer
	if err := printLeases(&buf, []client.Lease{l}, "", true, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\(etcd\)\s+m\s+etcd \(lease 000000000000694d\)\s+Held\s+<unknown>\s*$`).MatchString(buf.String()) {
		t.Errorf("got = %q, expected: (etcd) m etcd (lease 000000000000694d) Held <unknown>", buf.String())
	}
}

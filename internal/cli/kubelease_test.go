package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/cluster"
	"github.com/tenurehq/tenure/server"
)

// TestGetLeaseAllNamespacesShowsKubernetesLeases: `tenure get lease -A`
// lists the Kubernetes Leases kube-apiserver stores, under the namespace
// "(kubernetes)/<namespace>", with their holder, status and age (-o wide:
// no token, Kubernetes' TTL and transitions), and in -o json their
// kind, key and resourceVersion. A node that stopped renewing shows as
// Expired.
func TestGetLeaseAllNamespacesShowsKubernetesLeases(t *testing.T) {
	c := cluster.New(t, 1, cluster.WithEtcd(server.Compaction{}), cluster.WithKubernetesPrefix("/registry"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ec := c.EtcdClient(ctx)
	now := time.Now()
	put, err := ec.Put(ctx, "/registry/leases/kube-system/kube-scheduler", cluster.KubeLeaseJSON("kube-system", "kube-scheduler", "node-1_6f1f", 15, 3, now.Add(-90*time.Second), now))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ec.Put(ctx, "/registry/leases/kube-node-lease/node-2", cluster.KubeLeaseJSON("kube-node-lease", "node-2", "node-2", 40, 0, now.Add(-time.Hour), now.Add(-100*time.Second))); err != nil {
		t.Fatal(err)
	}

	ep := []string{"--endpoints", c.Node(0).Addr()}
	stdout, stderr, code := runMain(append(ep, "get", "lease", "-A")...)
	t.Logf("get lease -A:\n%s", stdout)
	for _, row := range []string{
		`(?m)^\(kubernetes\)/kube-system\s+kube-scheduler\s+node-1_6f1f\s+Held\s+9\ds\s*$`,
		`(?m)^\(kubernetes\)/kube-node-lease\s+node-2\s+node-2\s+Expired 6\ds ago\s+60m\s*$`,
	} {
		if code != 0 || !regexp.MustCompile(row).MatchString(stdout) {
			t.Errorf("get lease -A: got = exit %d, %q, stderr %q, expected a row matching %s", code, stdout, stderr, row)
		}
	}
	wide, stderr, code := runMain(append(ep, "get", "lease", "-A", "-o", "wide")...)
	if code != 0 || !regexp.MustCompile(`(?m)^\(kubernetes\)/kube-system\s+kube-scheduler\s+node-1_6f1f\s+Held\s+\S+\s+<none>\s+15s\s+1\ds\s+<none>\s+0\s+3\s+<none>\s*$`).MatchString(wide) {
		t.Errorf("get lease -A -o wide: got = exit %d, %q, stderr %q, expected: TOKEN <none>, TTL 15s, TRANSITIONS 3", code, wide, stderr)
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
		if d.Status.Kind != client.KindKubernetes || d.Metadata.Name != "kube-scheduler" {
			continue
		}
		found = true
		if d.Metadata.Namespace != "kube-system" || d.Status.Key != "/registry/leases/kube-system/kube-scheduler" || d.Metadata.ResourceVersion != fmt.Sprint(put.Header.Revision) ||
			d.Status.Phase != "held" || d.Spec.LeaseTransitions != 3 || d.Spec.HolderIdentity == nil || *d.Spec.HolderIdentity != "node-1_6f1f" {
			t.Errorf("kube-scheduler in -o json: got = %+v, expected: held by node-1_6f1f, key and resourceVersion %d, 3 transitions", d, put.Header.Revision)
		}
	}
	if !found {
		t.Errorf("-o json has no Kubernetes Lease: %s", out)
	}

	// One Lease by the namespace the list gives it; in -o json the
	// document is the Lease's.
	one, stderr, code := runMain(append(ep, "get", "lease", "-n", "(kubernetes)/kube-system", "kube-scheduler")...)
	if code != 0 || !regexp.MustCompile(`(?m)^\(kubernetes\)/kube-system\s+kube-scheduler\s+node-1_6f1f\s+Held\s`).MatchString(one) || strings.Contains(one, "node-2") {
		t.Errorf("get lease -n (kubernetes)/kube-system kube-scheduler: got = exit %d, %q, stderr %q, expected: its row alone", code, one, stderr)
	}
	js, stderr, code := runMain(append(ep, "get", "lease", "-n", "(kubernetes)/kube-node-lease", "node-2", "-o", "json")...)
	var d leaseDoc
	if err := json.Unmarshal([]byte(js), &d); code != 0 || err != nil || d.Status.Key != "/registry/leases/kube-node-lease/node-2" {
		t.Errorf("get lease -n (kubernetes)/kube-node-lease node-2 -o json: got = exit %d, %v, %q, stderr %q, expected: its document", code, err, js, stderr)
	}
	if _, stderr, code := runMain(append(ep, "get", "lease", "-n", "(kubernetes)/kube-system", "node-2")...); code != ExitUnmet || !strings.Contains(stderr, "not found") {
		t.Errorf("a Lease in another namespace: got = exit %d, stderr %q, expected: exit %d, not found", code, stderr, ExitUnmet)
	}
}

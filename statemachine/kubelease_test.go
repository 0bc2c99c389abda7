package statemachine

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func kubeGolden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../kubelease/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestKubernetesLeasesAreTheLeasesUnderThePrefix(t *testing.T) {
	m := New()
	step := int64(0)
	put := func(key, value string) {
		t.Helper()
		step += setupTick
		if res := m.Apply(step, Put{Key: key, Value: value}); res.Err != nil {
			t.Fatalf("Put(%q): %v", key, res.Err)
		}
	}
	m.Apply(step, SetVersion{Version: BinaryVersion})
	pb, js := kubeGolden(t, "v1.pb"), kubeGolden(t, "v1.json")
	put("/registry/leases/kube-system/kube-scheduler", pb)
	put("/registry/leases/kube-system/kube-controller-manager", strings.ReplaceAll(js, "kube-scheduler", "kube-controller-manager"))
	put("/registry/leases/kube-node-lease/node-1", "garbage")    // not a Lease
	put("/registry/leases/kube-system/impostor", pb)             // names kube-scheduler
	put("/registry/leases/kube-system", pb)                      // no name
	put("/registry/leasesx/kube-system/kube-scheduler", pb)      // another resource
	put("/other/leases/kube-system/kube-scheduler", pb)          // another apiserver
	put("/registry/pods/kube-system/kube-scheduler", pb)         // not under leases/
	put("/registry/leases/kube-system/kube-scheduler/extra", pb) // too deep

	var got []string
	for _, l := range m.KubernetesLeases("/registry") {
		k, _ := m.Key(l.Key)
		if l.CreateRevision != k.CreateRevision || l.ModRevision != k.ModRevision {
			t.Errorf("%s: revisions %d/%d, expected: the key's %d/%d", l.Key, l.CreateRevision, l.ModRevision, k.CreateRevision, k.ModRevision)
		}
		got = append(got, fmt.Sprintf("%s/%s %s %ds #%d", l.Namespace, l.Name, l.HolderIdentity, l.LeaseDurationSeconds, l.LeaseTransitions))
	}
	expected := []string{
		"kube-system/kube-controller-manager node-1_7c1e7b0e-2f52-4d8e-8d0c-3c0b0f0e9a11 15s #3",
		"kube-system/kube-scheduler node-1_7c1e7b0e-2f52-4d8e-8d0c-3c0b0f0e9a11 15s #3",
	}
	if fmt.Sprint(got) != fmt.Sprint(expected) {
		t.Errorf("KubernetesLeases(/registry):\ngot      = %q\nexpected: %q", got, expected)
	}
	if got := m.KubernetesLeases("/other/"); len(got) != 1 || got[0].Key != "/other/leases/kube-system/kube-scheduler" {
		t.Errorf("KubernetesLeases(/other/) = %+v, expected: the one key under /other/leases/", got)
	}
}

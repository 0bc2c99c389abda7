package kubelease

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The golden files are kube-scheduler's Lease as Kubernetes' own
// serializers write it (e2e/kube TestKubernetesLeaseGoldenBytes).
var (
	goldenAcquire = time.Date(2026, 11, 29, 1, 2, 3, 456789000, time.UTC)
	goldenRenew   = time.Date(2026, 11, 29, 1, 5, 7, 123456000, time.UTC)
	goldenHolder  = "node-1_7c1e7b0e-2f52-4d8e-8d0c-3c0b0f0e9a11"
)

func golden(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeReadsWhatKubernetesStores(t *testing.T) {
	held := Lease{APIVersion: "coordination.k8s.io/v1", Namespace: "kube-system", Name: "kube-scheduler",
		HolderIdentity: goldenHolder, LeaseDurationSeconds: 15, AcquireTime: goldenAcquire, RenewTime: goldenRenew, LeaseTransitions: 3}
	released := held
	released.HolderIdentity, released.AcquireTime = "", time.Time{}
	beta := held
	beta.APIVersion = "coordination.k8s.io/v1beta1"
	for _, c := range []struct {
		file     string
		expected Lease
	}{
		{"v1.pb", held},
		{"v1-released.pb", released},
		{"v1.json", held},
		{"v1beta1.pb", beta},
	} {
		got, ok := Decode(golden(t, c.file))
		if !ok || got != c.expected {
			t.Errorf("Decode(%s):\ngot      = %+v, %v\nexpected: %+v, true", c.file, got, ok, c.expected)
		}
	}
}

func TestDecodeSkipsWhatIsNotALease(t *testing.T) {
	pb := golden(t, "v1.pb")
	js := string(golden(t, "v1.json"))
	for _, c := range []struct {
		name  string
		value []byte
	}{
		{"an empty value", nil},
		{"a plain string", []byte("hello")},
		{"the protobuf magic alone", []byte("k8s\x00")},
		{"a value encrypted at rest", append([]byte("k8s:enc:aescbc:v1:key1:"), pb[4:]...)},
		{"a truncated protobuf Lease", pb[:len(pb)-7]},
		{"a protobuf Pod", bytes.Replace(bytes.Replace(pb, []byte("coordination.k8s.io/v1"), []byte("v1\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"), 1), []byte("Lease"), []byte("Pod\x00\x00"), 1)},
		{"a JSON Pod", []byte(strings.Replace(js, `"kind":"Lease"`, `"kind":"Pod"`, 1))},
		{"a Lease of an unknown group", []byte(strings.Replace(js, `coordination.k8s.io/v1`, `example.com/v1`, 1))},
		{"a Lease whose renewTime is no time", []byte(strings.Replace(js, `"2026-11-29T01:05:07.123456Z"`, `"yesterday"`, 1))},
		{"a Lease whose duration is a string", []byte(strings.Replace(js, `"leaseDurationSeconds":15`, `"leaseDurationSeconds":"15"`, 1))},
		{"JSON cut short", []byte(js[:len(js)-3])},
	} {
		if got, ok := Decode(c.value); ok {
			t.Errorf("Decode(%s) = %+v, true; expected: not a Lease", c.name, got)
		}
	}
}

func TestExpiredIsPastRenewPlusDuration(t *testing.T) {
	l, _ := Decode(golden(t, "v1.pb"))
	for _, c := range []struct {
		at       time.Time
		expected bool
	}{
		{goldenRenew, false},
		{goldenRenew.Add(15*time.Second - time.Microsecond), false},
		{goldenRenew.Add(15 * time.Second), true},
	} {
		if got := l.Expired(c.at); got != c.expected {
			t.Errorf("Expired(renew+%v) = %v, expected: %v", c.at.Sub(goldenRenew), got, c.expected)
		}
	}
	l.HolderIdentity = ""
	if l.Expired(goldenRenew.Add(time.Hour)) {
		t.Errorf("a Lease with no holder is expired; expected: not, there is no holder to expire")
	}
}

func TestParseKey(t *testing.T) {
	pfx := KeysPrefix("/registry/")
	if pfx != "/registry/leases/" {
		t.Fatalf("KeysPrefix(/registry/) = %q, expected: /registry/leases/", pfx)
	}
	for _, c := range []struct {
		key      string
		ns, name string
		ok       bool
	}{
		{"/registry/leases/kube-node-lease/node-1", "kube-node-lease", "node-1", true},
		{"/registry/leases/\xff\x00/n\xfe", "\xff\x00", "n\xfe", true},
		{"/registry/leases/kube-system", "", "", false},
		{"/registry/leases/kube-system/", "", "", false},
		{"/registry/leases//name", "", "", false},
		{"/registry/leases/a/b/c", "", "", false},
		{"/registry/leasesx/a/b", "", "", false},
	} {
		ns, name, ok := ParseKey(pfx, c.key)
		if ns != c.ns || name != c.name || ok != c.ok {
			t.Errorf("ParseKey(%q) = %q, %q, %v; expected: %q, %q, %v", c.key, ns, name, ok, c.ns, c.name, c.ok)
		}
	}
}

// FuzzKubernetesLease: any bytes an etcd client writes under the prefix. Decode
// must not panic, and a Lease it accepts must have a type it knows and
// times that render.
func FuzzKubernetesLease(f *testing.F) {
	for _, name := range []string{"v1.pb", "v1-released.pb", "v1.json", "v1beta1.pb"} {
		f.Add(golden(f, name))
	}
	f.Add([]byte("k8s\x00\x0a\x00"))
	f.Add([]byte(`{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","spec":{"renewTime":"0000-01-01T00:00:00Z"}}`))
	f.Fuzz(func(t *testing.T, value []byte) {
		l, ok := Decode(value)
		if !ok {
			return
		}
		if !isLeaseType(l.APIVersion, "Lease") {
			t.Fatalf("accepted apiVersion %q", l.APIVersion)
		}
		for _, tm := range []time.Time{l.AcquireTime, l.RenewTime} {
			if !tm.IsZero() && (tm.Year() < 1 || tm.Year() > 9999) {
				t.Fatalf("accepted time %v", tm)
			}
			_ = tm.Format(time.RFC3339Nano)
		}
		_ = l.Expired(time.Now())
	})
}

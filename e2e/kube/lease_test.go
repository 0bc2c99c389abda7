//go:build linux

package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	coordinationv1beta1 "k8s.io/api/coordination/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Kubernetes Leases as kube-apiserver stores them: coordination.k8s.io
// v1 (and v1beta1, the same shape) through the scheme's own serializers.
var (
	leaseScheme = runtime.NewScheme()
	leaseCodecs = serializer.NewCodecFactory(leaseScheme)
)

func init() {
	utilruntime.Must(coordinationv1.AddToScheme(leaseScheme))
	utilruntime.Must(coordinationv1beta1.AddToScheme(leaseScheme))
}

// leaseCodec encodes and decodes Leases of gv in mediaType, as
// kube-apiserver's storage codec does for --storage-media-type.
func leaseCodec(t testing.TB, mediaType string, gv schema.GroupVersion) runtime.Codec {
	info, ok := runtime.SerializerInfoForMediaType(leaseCodecs.SupportedMediaTypes(), mediaType)
	if !ok {
		t.Fatalf("no serializer for %s", mediaType)
	}
	return leaseCodecs.CodecForVersions(info.Serializer, leaseCodecs.UniversalDeserializer(), gv, gv)
}

var updateGolden = flag.Bool("update", false, "rewrite the core module's kubelease/testdata golden files")

// goldenLease is the Lease of the golden files: kube-scheduler's, as a
// leader-election LeaseLock writes it.
func goldenLease() *coordinationv1.Lease {
	acquire := metav1.NewMicroTime(time.Date(2026, 11, 29, 1, 2, 3, 456789000, time.UTC))
	renew := metav1.NewMicroTime(time.Date(2026, 11, 29, 1, 5, 7, 123456000, time.UTC))
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler", Namespace: "kube-system", UID: "6f1f6d1e-0d4f-4d1b-9a57-4a1d1f1a2b3c", ResourceVersion: "", CreationTimestamp: metav1.NewTime(acquire.Time.Truncate(time.Second))},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("node-1_7c1e7b0e-2f52-4d8e-8d0c-3c0b0f0e9a11"),
			LeaseDurationSeconds: ptr.To[int32](15),
			AcquireTime:          &acquire,
			RenewTime:            &renew,
			LeaseTransitions:     ptr.To[int32](3),
		},
	}
}

// TestKubernetesLeaseGoldenBytes checks that the core module's
// kubelease golden files are what Kubernetes' serializers write today
// (go test -run TestKubernetesLeaseGoldenBytes -update rewrites them).
func TestKubernetesLeaseGoldenBytes(t *testing.T) {
	released := goldenLease()
	released.Spec.HolderIdentity = nil
	released.Spec.AcquireTime = nil
	var beta coordinationv1beta1.Lease
	if err := leaseScheme.Convert(goldenLease(), &beta, nil); err != nil {
		// v1 and v1beta1 share no conversion funcs: copy the shape.
		beta = coordinationv1beta1.Lease{ObjectMeta: goldenLease().ObjectMeta}
		s := goldenLease().Spec
		beta.Spec = coordinationv1beta1.LeaseSpec{HolderIdentity: s.HolderIdentity, LeaseDurationSeconds: s.LeaseDurationSeconds,
			AcquireTime: s.AcquireTime, RenewTime: s.RenewTime, LeaseTransitions: s.LeaseTransitions}
	}
	for _, c := range []struct {
		file      string
		mediaType string
		gv        schema.GroupVersion
		obj       runtime.Object
	}{
		{"v1.pb", runtime.ContentTypeProtobuf, coordinationv1.SchemeGroupVersion, goldenLease()},
		{"v1-released.pb", runtime.ContentTypeProtobuf, coordinationv1.SchemeGroupVersion, released},
		{"v1.json", runtime.ContentTypeJSON, coordinationv1.SchemeGroupVersion, goldenLease()},
		{"v1beta1.pb", runtime.ContentTypeProtobuf, coordinationv1beta1.SchemeGroupVersion, &beta},
	} {
		var buf bytes.Buffer
		if err := leaseCodec(t, c.mediaType, c.gv).Encode(c.obj, &buf); err != nil {
			t.Fatalf("%s: encode: %v", c.file, err)
		}
		path := filepath.Join("..", "..", "kubelease", "testdata", c.file)
		if *updateGolden {
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, buf.Bytes()) {
			t.Errorf("%s:\ngot      = %q\nexpected: %q (Kubernetes' serializer today; -update rewrites it)", path, got, buf.Bytes())
		}
	}
}

// identity is the store's transformer: values stored as encoded, as
// kube-apiserver stores them without encryption at rest.
type identity struct{}

func (identity) TransformFromStorage(_ context.Context, data []byte, _ value.Context) ([]byte, bool, error) {
	return data, false, nil
}

func (identity) TransformToStorage(_ context.Context, data []byte, _ value.Context) ([]byte, error) {
	return data, nil
}

// leaseStore is k8s.io/apiserver's etcd3 store of coordination/v1
// Leases on addr, under /registry/leases/ as kube-apiserver keeps them,
// encoded as codec encodes.
func leaseStore(t *testing.T, addr string, codec runtime.Codec) storage.Interface {
	t.Helper()
	client, err := kubernetes.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	versioner := storage.APIObjectVersioner{}
	s, err := etcd3.New(client, compactor, codec,
		func() runtime.Object { return &coordinationv1.Lease{} },
		func() runtime.Object { return &coordinationv1.LeaseList{} },
		"/registry", "/leases/", schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"},
		identity{}, etcd3.NewDefaultLeaseManagerConfig(), etcd3.NewDefaultDecoder(codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// nativeLease is a lease as Tenure's native API answers in JSON.
type nativeLease struct {
	Kind             string    `json:"kind"`
	Namespace        string    `json:"namespace"`
	Name             string    `json:"name"`
	HolderIdentity   string    `json:"holderIdentity"`
	LeaseDuration    string    `json:"leaseDuration"`
	LeaseTransitions string    `json:"leaseTransitions"` // int64: a JSON string
	Status           string    `json:"status"`
	RenewTime        time.Time `json:"renewTime"`
	Key              []byte    `json:"key"`
}

// tenureLeases lists the leases of every namespace through the native
// API's Connect JSON, as any HTTP client can.
func tenureLeases(t *testing.T, api string) []nativeLease {
	t.Helper()
	resp, err := http.Post("http://"+api+"/tenure.v1.LeaseService/List", "application/json", strings.NewReader(`{"allNamespaces":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Leases []nativeLease `json:"leases"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("ListLeases: %s, %v", resp.Status, err)
	}
	return out.Leases
}

// A Lease kube-apiserver's own storage code writes to Tenure — through
// k8s.io/apiserver's etcd3 store, protobuf as by default and JSON as
// with --storage-media-type=application/json — shows in Tenure's native
// API as a lease of kind kubernetes, with its holder, duration and
// transitions; a handover through the store is one audit line in
// Tenure's log and a grant in its per-lease metrics.
func TestKubernetesLeaseStoredByTheApiserverShowsInTenure(t *testing.T) {
	node := startTenureNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	now := metav1.NewMicroTime(time.Now().Truncate(time.Microsecond))
	for _, c := range []struct {
		mediaType, ns string
	}{
		{runtime.ContentTypeProtobuf, "kube-system"},
		{runtime.ContentTypeJSON, "json-stored"},
	} {
		s := leaseStore(t, node.etcd, leaseCodec(t, c.mediaType, coordinationv1.SchemeGroupVersion))
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler", Namespace: c.ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-1_a"), LeaseDurationSeconds: ptr.To[int32](15),
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr.To[int32](4)},
		}
		key := "/leases/" + c.ns + "/kube-scheduler"
		if err := s.Create(ctx, key, l, &coordinationv1.Lease{}, 0); err != nil {
			t.Fatalf("%s: Create: %v", c.mediaType, err)
		}
		// A handover, as client-go's LeaseLock.Update does it.
		err := s.GuaranteedUpdate(ctx, key, &coordinationv1.Lease{}, false, nil, func(in runtime.Object, _ storage.ResponseMeta) (runtime.Object, *uint64, error) {
			l := in.(*coordinationv1.Lease).DeepCopy()
			l.Spec.HolderIdentity, l.Spec.LeaseTransitions = ptr.To("node-2_b"), ptr.To[int32](5)
			return l, nil, nil
		}, nil)
		if err != nil {
			t.Fatalf("%s: GuaranteedUpdate: %v", c.mediaType, err)
		}
	}

	found := map[string]nativeLease{}
	for _, l := range tenureLeases(t, node.api) {
		if l.Kind == "kubernetes" {
			found[l.Namespace+"/"+l.Name] = l
		}
	}
	for _, name := range []string{"kube-system/kube-scheduler", "json-stored/kube-scheduler"} {
		l, ok := found[name]
		if !ok || l.HolderIdentity != "node-2_b" || l.LeaseDuration != "15s" || l.LeaseTransitions != "5" || l.Status != "held" ||
			!l.RenewTime.Equal(now.Time) || string(l.Key) != "/registry/leases/"+name {
			t.Errorf("%s in Tenure's list: got = %+v (found %v), expected: held by node-2_b, 15s, 5 transitions, renewed %v", name, l, ok, now.Time)
		}
	}

	logText, err := os.ReadFile(node.log)
	if err != nil {
		t.Fatal(err)
	}
	audit := regexp.MustCompile(`msg=audit log=audit principal=\(server\) action=kubernetes.lease.handover target=\(kubernetes\)/kube-system/kube-scheduler outcome=allowed reason="holder \\"node-1_a\\" -> \\"node-2_b\\" at revision \d+; transitions 5"`)
	if n := len(audit.FindAll(logText, -1)); n != 1 {
		t.Errorf("handover audit lines for kube-system/kube-scheduler: got = %d, expected: 1\n%s", n, logText)
	}
	resp, err := http.Get("http://" + node.api + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	for _, s := range []string{
		`tenure_lease_grants_total{lease="kube-scheduler",namespace="(kubernetes)/kube-system"} 2`,
		`tenure_lease_hold_seconds_count{lease="kube-scheduler",namespace="(kubernetes)/kube-system"} 1`,
		`tenure_lease_holders{lease="kube-scheduler",namespace="(kubernetes)/kube-system"} 1`,
	} {
		if !bytes.Contains(metrics, []byte(s)) {
			t.Errorf("/metrics lacks %s", s)
		}
	}
}

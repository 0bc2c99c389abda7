//go:build linux

package kube

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	coordinationv1beta1 "k8s.io/api/coordination/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
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

//go:build linux

package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"
)

// The example API group k8s.io/apiserver's storage tests are written
// over: example.Pod in memory, example/v1's Pod (with generated protobuf
// marshalling) in storage, as kube-apiserver keeps core/v1 Pods.
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
}

// valuePrefix is what the tests' transformer (storagetesting's
// PrefixTransformer, standing in for encryption at rest) puts before each
// encoded object, as upstream's store_test.go does.
const valuePrefix = "test!"

// protobufMagic opens every object k8s.io/apimachinery's protobuf
// serializer writes.
var protobufMagic = []byte("k8s\x00")

// protobufCodec encodes objects as example/v1 in protobuf, the encoding
// kube-apiserver stores by default (--storage-media-type), and decodes
// any encoding the scheme knows to the internal version. It is the codec
// storagetesting's apitesting.TestStorageCodec builds when
// KUBE_TEST_API_STORAGE_TYPE asks for protobuf, less the base64 wrapping
// that only etcd2's string values needed: the RunTest functions take
// whatever codec the store was built with and force none.
func protobufCodec(t testing.TB) runtime.Codec {
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatalf("no serializer for %s", runtime.ContentTypeProtobuf)
	}
	return codecs.CodecForVersions(info.Serializer, codecs.UniversalDeserializer(),
		schema.GroupVersions{examplev1.SchemeGroupVersion}, runtime.InternalGroupVersioner)
}

// testStore is k8s.io/apiserver's etcd3 store, the storage.Interface
// kube-apiserver runs, on one server, under a key prefix of the test's
// own (so that tests can share a server), with what the RunTest
// functions reach around the interface for.
type testStore struct {
	storage.Interface
	srv    server
	prefix string // the store's path prefix, as kube-apiserver's /registry; none on a fresh server

	// client is the store's client; its KV and Kubernetes are
	// storagetesting's recorders, counting the store's reads.
	client *kubernetes.Client
	kv     *storagetesting.KVRecorder
	lists  *storagetesting.KubernetesRecorder
	// raw reads the server without being counted.
	raw clientv3.KV

	codec       runtime.Codec
	transformer *swapTransformer
}

// storeOptions change what newStore builds.
type storeOptions struct {
	codec runtime.Codec
	// transformer is the store's transformer before the test swaps it;
	// by default a PrefixTransformer writing valuePrefix.
	transformer value.Transformer
	// unsafeDelete wraps the store as kube-apiserver does when
	// AllowUnsafeMalformedObjectDeletion is on.
	unsafeDelete bool
}

var testPrefixes atomic.Int64

// newStore builds the etcd3 store on srv, as upstream's store_test.go
// testSetup does, over a client of its own. Cleanup closes both.
func newStore(t *testing.T, srv server, o storeOptions) *testStore {
	t.Helper()
	if o.codec == nil {
		o.codec = protobufCodec(t)
	}
	if o.transformer == nil {
		o.transformer = storagetesting.NewPrefixTransformer([]byte(valuePrefix), false)
	}
	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   []string{srv.addr},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("%s: client: %v", srv.name, err)
	}
	t.Cleanup(func() { client.Close() })
	raw := clientv3.NewKV(client.Client)
	lists := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	kv := storagetesting.NewKVRecorder(client.KV, lists)
	client.KV, client.Kubernetes = kv, lists

	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	leases := etcd3.NewDefaultLeaseManagerConfig()
	// As upstream's tests do: a test waits no longer than a second for a
	// lease to be given up.
	leases.ReuseDurationSeconds = 1
	transformer := &swapTransformer{cur: o.transformer}
	prefix := ""
	if !srv.fresh {
		prefix = fmt.Sprintf("/%d-%s", testPrefixes.Add(1), unsafeKeyChars.ReplaceAllString(t.Name(), "_"))
	}
	versioner := storage.APIObjectVersioner{}
	s, err := etcd3.New(client, compactor, o.codec,
		func() runtime.Object { return &example.Pod{} },
		func() runtime.Object { return &example.PodList{} },
		prefix, "/pods/", schema.GroupResource{Resource: "pods"},
		transformer, leases, etcd3.NewDefaultDecoder(o.codec, versioner), versioner)
	if err != nil {
		t.Fatalf("%s: etcd3.New: %v", srv.name, err)
	}
	t.Cleanup(s.Close)
	ts := &testStore{Interface: s, srv: srv, prefix: prefix, client: client, kv: kv, lists: lists,
		raw: raw, codec: o.codec, transformer: transformer}
	if o.unsafeDelete {
		ts.Interface = etcd3.NewStoreWithUnsafeCorruptObjectDeletion(s, schema.GroupResource{Resource: "pods"})
	}
	return ts
}

var unsafeKeyChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// swapTransformer is the store's transformer, which a test may swap for
// another while the store runs. Upstream's tests assign the store's
// unexported fields instead.
type swapTransformer struct {
	mu  sync.Mutex // guards cur
	cur value.Transformer
}

func (s *swapTransformer) get() value.Transformer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *swapTransformer) set(t value.Transformer) {
	s.mu.Lock()
	s.cur = t
	s.mu.Unlock()
}

func (s *swapTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swapTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// UpdatePrefixTransformer makes the store a
// storagetesting.InterfaceWithPrefixTransformer.
func (s *testStore) UpdatePrefixTransformer(modify storagetesting.PrefixTransformerModifier) func() {
	orig := s.transformer.get()
	p := *orig.(*storagetesting.PrefixTransformer)
	s.transformer.set(modify(&p))
	return func() { s.transformer.set(orig) }
}

// UpdateTransformer makes the store a
// storagetesting.InterfaceWithTransformerOverride.
func (s *testStore) UpdateTransformer(modify storagetesting.TransformerModifier) func() {
	orig := s.transformer.get()
	s.transformer.set(modify(orig))
	return func() { s.transformer.set(orig) }
}

// storedProtobuf is the KeyValidation of RunTestCreate and
// RunTestGuaranteedUpdate: the value under key is the transformer's
// prefix and then a protobuf-encoded example/v1 Pod, written without a
// resource version or self link (which the store derives on reads).
func (s *testStore) storedProtobuf(ctx context.Context, t *testing.T, key string) {
	resp, err := s.raw.Get(ctx, s.prefix+key)
	if err != nil {
		t.Fatalf("%s: get %s: %v", s.srv.name, s.prefix+key, err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("%s: nothing stored under %s", s.srv.name, s.prefix+key)
	}
	stored := resp.Kvs[0].Value
	encoded, ok := bytes.CutPrefix(stored, []byte(valuePrefix))
	if !ok || !bytes.HasPrefix(encoded, protobufMagic) {
		t.Fatalf("%s: stored value is not %q and then protobuf: %q", s.srv.name, valuePrefix, stored)
	}
	decoded, err := runtime.Decode(s.codec, encoded)
	if err != nil {
		t.Fatalf("%s: decode the stored object: %v", s.srv.name, err)
	}
	pod := decoded.(*example.Pod)
	if pod.ResourceVersion != "" {
		t.Errorf("%s: stored object has resource version %q, expected none", s.srv.name, pod.ResourceVersion)
	}
	if pod.SelfLink != "" {
		t.Errorf("%s: stored object has self link %q, expected none", s.srv.name, pod.SelfLink)
	}
}

// compact is the Compaction the RunTest functions take: it compacts the
// server's history at a resource version through etcd3.Compact (the
// store's own compaction: a Txn on etcd3's compact_rev_key, then
// Compact), and, when ListFromCacheSnapshot has the store watch that
// key, waits until the store has seen it.
func (s *testStore) compact(ctx context.Context, t *testing.T, resourceVersion string) {
	rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	// Compact compacts only when compact_rev_key's version is the one
	// given, and says nothing when it is not: on a server that an earlier
	// test compacted, the first attempt reads the version, the second
	// compacts. (Upstream's tests, each on a fresh etcd, expect version 0.)
	var version, compacted int64
	for range 3 {
		version, _, compacted, err = etcd3.Compact(ctx, s.client.Client, version, int64(rv))
		if err == nil && compacted == int64(rv) {
			break
		}
	}
	if err != nil || compacted != int64(rv) {
		t.Fatalf("%s: compact at %d: compacted at %d, %v", s.srv.name, rv, compacted, err)
	}
	if !utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
		return
	}
	for s.CompactRevision() != int64(rv) {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: the store never saw the compaction at %d: %v", s.srv.name, rv, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// increaseRV is the IncreaseRVFunc the RunTest functions take: a write
// outside the store's keys, whose revision it returns.
func (s *testStore) increaseRV(ctx context.Context, t *testing.T) int64 {
	resp, err := s.raw.Put(ctx, "increaseRV", "ok")
	if err != nil {
		t.Fatalf("%s: put increaseRV: %v", s.srv.name, err)
	}
	return resp.Header.Revision
}

// keys is the storage.KeysFunc of the store's size estimation: the keys
// under the store's resource prefix, read keys-only, as the store's own
// getKeys does.
func (s *testStore) keys(ctx context.Context) ([]string, error) {
	resp, err := s.raw.Get(ctx, s.prefix+"/pods/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys, nil
}

// maxLimit is etcd3's largest page (its unexported maxLimit).
const maxLimit = 10000

// countedCalls is the CallsValidation of the list continuation tests, as
// upstream's checkStorageCallsInvariants: the transformer saw each object
// read once, and the store read the server in as few pages as its
// doubling page size allows.
func (s *testStore) countedCalls(t *testing.T, pageSize, estimatedProcessedObjects uint64) {
	transformer := s.transformer.get().(*storagetesting.PrefixTransformer)
	if reads := transformer.GetReadsAndReset(); reads != estimatedProcessedObjects {
		t.Errorf("%s: transformer reads = %d, expected: %d", s.srv.name, reads, estimatedProcessedObjects)
	}
	estimatedGetCalls := uint64(1)
	if pageSize != 0 {
		currLimit := pageSize
		for sum := uint64(1); sum < estimatedProcessedObjects; {
			currLimit = min(currLimit*2, maxLimit)
			sum += currLimit
			estimatedGetCalls++
		}
	}
	if reads := s.kv.GetReadsAndReset() + s.kv.GetStreamReadsAndReset(); reads != estimatedGetCalls {
		t.Fatalf("%s: server reads = %d, expected: %d", s.srv.name, reads, estimatedGetCalls)
	}
}

// failingTransformer fails every read while fail is set, as upstream's
// testTransformer does, and always when it wraps no transformer.
type failingTransformer struct {
	value.Transformer
	fail atomic.Bool
}

func (f *failingTransformer) setFailing(fail bool) { f.fail.Store(fail) }

func (f *failingTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if f.fail.Load() || f.Transformer == nil {
		return nil, false, errors.New("bits flipped")
	}
	return f.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

// failingCodec fails every decode while fail is set, as upstream's
// testCodec does.
type failingCodec struct {
	runtime.Codec
	fail atomic.Bool
}

func (f *failingCodec) setFailing(fail bool) { f.fail.Store(fail) }

func (f *failingCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if f.fail.Load() {
		return nil, nil, errors.New("synthetic error")
	}
	return f.Codec.Decode(data, defaults, into)
}

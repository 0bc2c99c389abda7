package client

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// KeyValue is a key with its revisions. Key and Value are the bytes as
// stored, which need not be UTF-8 (a key written through the etcd API
// may be any bytes); api.EscapeNonUTF8 shows them to a person.
type KeyValue struct {
	Key            string
	Value          string
	CreateRevision int64
	ModRevision    int64
	Version        int64
	TTL            time.Duration // 0 unless the key has a TTL of its own
	SessionID      int64         // 0 unless the key is bound to a session
}

// checkUTF8 refuses, before anything is sent, a key or value that is not
// UTF-8: the native API carries them as protobuf strings, which hold only
// UTF-8. Such keys are written through the etcd API; the native API
// reads them (KeyValue holds their bytes). args alternate names and
// values.
func checkUTF8(args ...string) error {
	for i := 0; i+1 < len(args); i += 2 {
		if !utf8.ValidString(args[i+1]) {
			return fmt.Errorf("%w: %s %q is not UTF-8: the native API takes UTF-8 keys and values; write other bytes through the etcd API", ErrInvalidArgument, args[i], args[i+1])
		}
	}
	return nil
}

func kvFrom(p *tenurev1.KeyValue) KeyValue {
	if p == nil {
		return KeyValue{}
	}
	key, value := p.GetKey(), p.GetValue()
	if b := p.GetKeyBytes(); len(b) > 0 {
		key = string(b)
	}
	if b := p.GetValueBytes(); len(b) > 0 {
		value = string(b)
	}
	return KeyValue{
		Key: key, Value: value,
		CreateRevision: p.GetCreateRevision(), ModRevision: p.GetModRevision(), Version: p.GetVersion(),
		TTL: p.GetTtl().AsDuration(), SessionID: p.GetSessionId(),
	}
}

// KV is the key/value layer: revisions, compare-and-swap, TTLs, watches —
// the primitives for building recipes of your own.
type KV struct{ c *Client }

// KV returns the client's key/value API.
func (c *Client) KV() *KV { return &KV{c} }

// writeOptions configure Put and CompareAndSwap.
type writeOptions struct {
	ttl     time.Duration
	session *Session
}

// WriteOption configures a write.
type WriteOption func(*writeOptions)

// WithKeyTTL makes the key expire d after this write unless written again.
func WithKeyTTL(d time.Duration) WriteOption { return func(o *writeOptions) { o.ttl = d } }

// WithSession binds the key to a session: it is deleted when the session
// ends.
func WithSession(s *Session) WriteOption { return func(o *writeOptions) { o.session = s } }

func writeOpts(opts []WriteOption) (ttl *durationpb.Duration, session int64) {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.ttl > 0 {
		ttl = durationpb.New(o.ttl)
	}
	if o.session != nil {
		session = o.session.id
	}
	return ttl, session
}

// ReadOption changes how a read is served.
type ReadOption func(*readOptions)

type readOptions struct{ stale bool }

func readOpts(opts []ReadOption) readOptions {
	var o readOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Stale lets the node called answer from its own state, which may trail
// the leader's by a moment (or by as long as it is cut off from the
// leader): cheaper, and served by any node. Without it a read is
// linearizable: it sees every write acknowledged before it began.
func Stale() ReadOption { return func(o *readOptions) { o.stale = true } }

// Get returns a key, or ErrNotFound.
func (kv *KV) Get(ctx context.Context, key string, opts ...ReadOption) (KeyValue, error) {
	var out KeyValue
	if err := checkUTF8("key", key); err != nil {
		return out, err
	}
	o := readOpts(opts)
	err := kv.c.do(ctx, "Get", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: key, Stale: o.stale}))
		if err == nil {
			out = kvFrom(resp.Msg.GetKv())
		}
		return err
	})
	return out, err
}

// Range returns up to limit keys with the prefix (0 = all), sorted, the
// keys' revision (the KV revision) at the read, and whether more were
// left out.
func (kv *KV) Range(ctx context.Context, prefix string, limit int64, opts ...ReadOption) (kvs []KeyValue, revision int64, more bool, err error) {
	if err := checkUTF8("prefix", prefix); err != nil {
		return nil, 0, false, err
	}
	o := readOpts(opts)
	err = kv.c.do(ctx, "Range", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: prefix, Limit: limit, Stale: o.stale}))
		if err != nil {
			return err
		}
		kvs = kvs[:0]
		for _, p := range resp.Msg.GetKvs() {
			kvs = append(kvs, kvFrom(p))
		}
		revision, more = resp.Msg.GetRevision(), resp.Msg.GetMore()
		return nil
	})
	return kvs, revision, more, err
}

// Put writes a key and returns the revision of the write. A Put is not
// repeated after a failure that leaves its outcome unknown: it returns
// ErrUnknownOutcome instead.
func (kv *KV) Put(ctx context.Context, key, value string, opts ...WriteOption) (int64, error) {
	if err := checkUTF8("key", key, "value", value); err != nil {
		return 0, err
	}
	ttl, session := writeOpts(opts)
	var rev int64
	err := kv.c.do(ctx, "Put", once, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: key, Value: value, Ttl: ttl, SessionId: session}))
		if err == nil {
			rev = resp.Msg.GetRevision()
		}
		return err
	})
	return rev, err
}

// Delete removes a key and reports how many keys were deleted.
func (kv *KV) Delete(ctx context.Context, key string) (int64, error) {
	return kv.delete(ctx, key, false)
}

// DeletePrefix removes every key with the prefix.
func (kv *KV) DeletePrefix(ctx context.Context, prefix string) (int64, error) {
	return kv.delete(ctx, prefix, true)
}

func (kv *KV) delete(ctx context.Context, key string, prefix bool) (int64, error) {
	if err := checkUTF8("key", key); err != nil {
		return 0, err
	}
	var n int64
	err := kv.c.do(ctx, "Delete", once, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.Delete(ctx, connect.NewRequest(&tenurev1.DeleteRequest{Key: key, Prefix: prefix}))
		if err == nil {
			n = resp.Msg.GetDeleted()
		}
		return err
	})
	return n, err
}

// Compare is the condition of a CompareAndSwap.
type Compare struct{ c *tenurev1.Compare }

// Absent holds when the key does not exist.
func Absent() Compare {
	return Compare{&tenurev1.Compare{Target: &tenurev1.Compare_Absent{Absent: true}}}
}

// ValueIs holds when the key's value is v.
func ValueIs(v string) Compare {
	return Compare{&tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: v}}}
}

// ModRevisionIs holds when the key was last written at revision r (0:
// the key is absent).
func ModRevisionIs(r int64) Compare {
	return Compare{&tenurev1.Compare{Target: &tenurev1.Compare_ModRevision{ModRevision: r}}}
}

// CompareFailedError is returned (matching ErrCompareFailed) when the
// compare did not hold; Current is the key as it is (Found false when
// absent) and Revision the store's revision.
type CompareFailedError struct {
	Err      *Error
	Current  KeyValue
	Found    bool
	Revision int64
}

func (e *CompareFailedError) Error() string { return e.Err.Error() }

func (e *CompareFailedError) Unwrap() error { return e.Err }

// CompareAndSwap writes value only if the compare holds, and returns the
// key as written. When it does not hold, nothing is written and the error
// is a *CompareFailedError.
func (kv *KV) CompareAndSwap(ctx context.Context, key string, cmp Compare, value string, opts ...WriteOption) (KeyValue, error) {
	return kv.cas(ctx, "CompareAndSwap", &tenurev1.CompareAndSwapRequest{Key: key, Compare: cmp.c, Value: value}, opts)
}

// CompareAndDelete deletes the key only if the compare holds.
func (kv *KV) CompareAndDelete(ctx context.Context, key string, cmp Compare) error {
	_, err := kv.cas(ctx, "CompareAndDelete", &tenurev1.CompareAndSwapRequest{Key: key, Compare: cmp.c, Delete: true}, nil)
	return err
}

func (kv *KV) cas(ctx context.Context, op string, req *tenurev1.CompareAndSwapRequest, opts []WriteOption) (KeyValue, error) {
	if err := checkUTF8("key", req.GetKey(), "value", req.GetValue(), "compared value", req.GetCompare().GetValue()); err != nil {
		return KeyValue{}, err
	}
	req.Ttl, req.SessionId = writeOpts(opts)
	var out KeyValue
	err := kv.c.do(ctx, op, once, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.CompareAndSwap(ctx, connect.NewRequest(req))
		if err == nil {
			out = kvFrom(resp.Msg.GetKv())
		}
		return err
	})
	if errors.Is(err, ErrCompareFailed) {
		cf := &CompareFailedError{Err: err.(*Error)}
		var ce *connect.Error
		if errors.As(err, &ce) {
			for _, d := range ce.Details() {
				if m, derr := d.Value(); derr == nil {
					if cur, ok := m.(*tenurev1.GetResponse); ok {
						cf.Current, cf.Found, cf.Revision = kvFrom(cur.GetKv()), cur.GetKv() != nil, cur.GetRevision()
					}
				}
			}
		}
		return KeyValue{}, cf
	}
	return out, err
}

// EventType says what happened to a key.
type EventType int

const (
	EventPut EventType = iota + 1
	EventDelete
	EventExpire
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "PUT"
	case EventDelete:
		return "DELETE"
	case EventExpire:
		return "EXPIRE"
	}
	return "UNKNOWN"
}

// WatchEvent is one change to a watched key, or the error that ended the
// watch (then the channel closes).
type WatchEvent struct {
	Type     EventType
	Revision int64
	KV       KeyValue // after the change; for deletes only Key and ModRevision
	PrevKV   KeyValue
	Err      error
}

type watchOptions struct {
	prefix   bool
	revision int64
}

// WatchOption configures Watch.
type WatchOption func(*watchOptions)

// WithPrefix watches every key with the given prefix.
func WithPrefix() WatchOption { return func(o *watchOptions) { o.prefix = true } }

// WithRevision replays from revision r (inclusive) if the server still
// has it; otherwise the watch ends with ErrLagged.
func WithRevision(r int64) WatchOption { return func(o *watchOptions) { o.revision = r } }

// Watch sends every change to key (or keys under it, with WithPrefix) in
// revision order, from WithRevision or else from the store's revision
// when Watch returns, until ctx ends or an error ends the watch; the last
// event then carries Err and the channel closes. It reconnects on its own
// across endpoint failures, resuming after the last revision it sent; it
// never skips events: if the server's history no longer has them, the
// watch ends with ErrLagged.
func (kv *KV) Watch(ctx context.Context, key string, opts ...WatchOption) <-chan WatchEvent {
	var o watchOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkUTF8("key", key); err != nil {
		ch := make(chan WatchEvent, 1)
		ch <- WatchEvent{Err: err}
		close(ch)
		return ch
	}
	return watchInto(ctx, kv.c, "Watch", o.revision, false,
		func(ctx context.Context, ep *endpoint, from int64) (*connect.ServerStreamForClient[tenurev1.WatchEvent], error) {
			return ep.kv.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: key, Prefix: o.prefix, StartRevision: from}))
		},
		func(ev *tenurev1.WatchEvent) (int64, WatchEvent) {
			return ev.GetRevision(), WatchEvent{Type: EventType(ev.GetType()), Revision: ev.GetRevision(), KV: kvFrom(ev.GetKv()), PrevKV: kvFrom(ev.GetPrevKv())}
		},
		func(err error) WatchEvent { return WatchEvent{Err: err} })
}

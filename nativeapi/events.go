package nativeapi

import (
	"context"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/kubelease"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// watchSpec is a checked watch request: where to start and which events.
// The Connect watches and the NDJSON ones build it with the same
// functions, so that one bad filter gets the same answer from both.
type watchSpec struct {
	start  int64
	filter func(*statemachine.Event) bool
	// keys is set for a key watch: start and the events' revisions are
	// the keys' KV revisions (package keyfeed).
	keys bool
	// one is set when the watch follows one key (a key watch without a
	// prefix, of key) or one lease: its hub watcher is then keyed
	// (watch.Watcher.WantKey), so that while it waits the writes of
	// other keys and leases cost it nothing.
	one *watch.Key
	key string
	// reads reports whether a principal may still read all the watch
	// follows, as the check that let it open demanded: a watch whose
	// caller loses that read ends with permission_denied, as an etcd
	// watch is cancelled (etcdapi's sendEvents).
	reads func(g *auth.Grants) bool
}

// leaseWatch checks a lease watch: every namespace, or one (default
// "default"), and optionally one lease in it. etcdLocks adds the key
// events of etcd recipe locks (RecipeKind) to a watch of every
// namespace, as LEASE_EVENT_TYPE_ETCD_LOCK; kubeKeys (the prefix of
// Kubernetes Leases' keys, "" for none) those of Kubernetes Leases, as
// LEASE_EVENT_TYPE_KUBERNETES_LEASE.
func (l Limits) leaseWatch(allNamespaces bool, ns, name string, start int64, etcdLocks bool, kubeKeys string) (watchSpec, error) {
	if etcdLocks && (!allNamespaces || name != "") {
		return watchSpec{}, Invalid("etcd_locks needs all_namespaces and no name: etcd locks have no namespace")
	}
	if kubeKeys != "" && (!allNamespaces || name != "") {
		return watchSpec{}, Invalid("kubernetes_leases needs all_namespaces and no name: Kubernetes Leases are listed across all namespaces only")
	}
	if !allNamespaces {
		var err error
		if ns, err = l.namespace(ns); err != nil {
			return watchSpec{}, err
		}
	} else {
		ns = ""
	}
	if name != "" {
		if err := l.leaseName(name); err != nil {
			return watchSpec{}, err
		}
	}
	if err := startRevision(start); err != nil {
		return watchSpec{}, err
	}
	// A watch of every namespace asks for nothing (its events are
	// filtered by what the caller reads); one of a namespace for read or
	// lock on it, as its holders' grant watches do.
	var reads func(g *auth.Grants) bool
	if !allNamespaces {
		reads = func(g *auth.Grants) bool { return g.Namespace(auth.Read, ns) || g.Namespace(auth.Lock, ns) }
	}
	filter := leaseFilter(ns, name)
	if etcdLocks {
		leases := filter
		filter = func(e *statemachine.Event) bool {
			_, ok := recipeEventPrefix(e)
			return ok || leases(e)
		}
	}
	if kubeKeys != "" {
		leases := filter
		filter = func(e *statemachine.Event) bool {
			_, ok := kubernetesEventKey(e, kubeKeys)
			return ok || leases(e)
		}
	}
	// A key event reaches the caller only if it may read the key
	// (Backend.Readable), as an etcd watch of it would.
	spec := watchSpec{start: start, filter: filter, reads: reads}
	if name != "" && !allNamespaces { // then neither etcdLocks nor kubeKeys
		one := watch.LeaseKey(statemachine.LeaseID{Namespace: ns, Name: name})
		spec.one = &one
	}
	return spec, nil
}

// recipeEventPrefix is the prefix of the etcd lock a key event changed:
// the key's, when it is a recipe key (statemachine.RecipePrefix) after
// the event or was one before it.
func recipeEventPrefix(e *statemachine.Event) (string, bool) {
	for _, kv := range []*statemachine.KeyValue{e.KV, e.PrevKV} {
		if kv == nil {
			continue
		}
		if pfx, ok := statemachine.RecipePrefix(kv.Key, kv.EtcdLease()); ok {
			return pfx, true
		}
	}
	return "", false
}

// kubernetesEventKey is the key of the Kubernetes Lease a key event
// put or deleted: a key under kubeKeys of the shape
// <namespace>/<name> (kubelease.ParseKey). Its value is not decoded: a
// watcher lists again to see what the key holds now.
func kubernetesEventKey(e *statemachine.Event, kubeKeys string) (string, bool) {
	if e.KV == nil || kubeKeys == "" {
		return "", false
	}
	_, _, ok := kubelease.ParseKey(kubeKeys, e.KV.Key)
	return e.KV.Key, ok
}

// keyWatch checks a key watch: one key, or every key under a prefix (which
// may be empty: the whole keyspace).
func (l Limits) keyWatch(key string, prefix bool, start int64) (watchSpec, error) {
	if !prefix {
		if err := l.readKey("key", key); err != nil {
			return watchSpec{}, err
		}
	}
	if err := startRevision(start); err != nil {
		return watchSpec{}, err
	}
	reads := func(g *auth.Grants) bool { return g.Key(auth.Read, key) }
	if prefix {
		reads = func(g *auth.Grants) bool { return g.KeyPrefix(auth.Read, key) }
	}
	spec := watchSpec{start: start, filter: watch.KeyFilter(key, prefix), keys: true, reads: reads}
	if !prefix {
		one := watch.KVKey(key)
		spec.one, spec.key = &one, key
	}
	return spec, nil
}

func startRevision(start int64) error {
	if start < 0 {
		return Invalid("start_revision %d is negative", start)
	}
	return nil
}

// leaseFilter selects lease events of a namespace ("" for all) and, when
// name is set, of one lease.
func leaseFilter(ns, name string) func(*statemachine.Event) bool {
	inNamespace := watch.LeaseFilter(ns)
	if name == "" {
		return inNamespace
	}
	return func(e *statemachine.Event) bool { return inNamespace(e) && e.Lease.Name == name }
}

// streamEvents feeds a Connect watch until the caller goes away, the
// server stops, or the watcher falls behind (an explicit error naming the
// revision to resync from). The watch holds one of the caller's
// open-watch slots while it runs, and is refused without one.
func (a *API) streamEvents(ctx context.Context, spec watchSpec, send func(*statemachine.Event) error) error {
	release, err := a.node.HoldWatch(ctx)
	if err != nil {
		return toConnect(err)
	}
	defer release()
	return a.feedEvents(ctx, spec, send)
}

// feedEvents is streamEvents without the slot, for a grant watch, which
// holds a wait slot instead.
func (a *API) feedEvents(ctx context.Context, spec watchSpec, send func(*statemachine.Event) error) error {
	w, err := a.openWatch(ctx, spec)
	if err != nil {
		return toConnect(err)
	}
	defer w.Close()
	if err := a.pumpEvents(ctx, w, spec, send); err != nil {
		return toConnect(err)
	}
	return nil
}

// pumpEvents feeds w's events to send until the caller goes away (nil),
// the server stops (nil), send fails, or the watcher falls behind (an
// explicit error naming the revision to resync from). It runs on the
// request's goroutine and starts one goroutine that ends with it. The
// Connect watches (streamEvents) and the NDJSON ones share it; it is
// split from the registration so that watchHTTP can answer in between.
func (a *API) pumpEvents(ctx context.Context, w eventSource, spec watchSpec, send func(*statemachine.Event) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-a.node.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	readable := a.node.Readable(ctx, spec.reads)
	for {
		e, err := w.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return toConnect(err)
		}
		if readable != nil {
			ok, err := readable(&e)
			if err != nil {
				return err // the credential no longer holds: the stream ends
			}
			if !ok {
				continue
			}
		}
		if err := send(&e); err != nil {
			return err
		}
	}
}

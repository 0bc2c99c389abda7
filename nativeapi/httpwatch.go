package nativeapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/statemachine"
)

// The connect streaming protocol frames every message in a binary
// envelope, which plain curl shows as noise. These endpoints stream the
// same events as newline-delimited JSON, one event per line, flushed as
// they happen:
//
//	curl -N 'http://127.0.0.1:7480/v1/watch/leases?namespace=default'
//	curl -N 'http://127.0.0.1:7480/v1/watch/leases?all_namespaces=true&etcd_locks=true&kubernetes_leases=true'
//	curl -N 'http://127.0.0.1:7480/v1/watch/keys?key=jobs/&prefix=true&start_revision=1'

func (a *API) watchLeasesHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	all, _ := strconv.ParseBool(q.Get("all_namespaces"))
	etcdLocks, _ := strconv.ParseBool(q.Get("etcd_locks"))
	kubeLeases, _ := strconv.ParseBool(q.Get("kubernetes_leases"))
	kubeKeys := a.kubernetesKeys(kubeLeases)
	start, err := queryRevision(q.Get("start_revision"))
	if err == nil {
		err = a.checkHTTP(r, &tenurev1.WatchLeasesRequest{Namespace: q.Get("namespace"), AllNamespaces: all, Name: q.Get("name"), EtcdLocks: etcdLocks, KubernetesLeases: kubeLeases})
	}
	if err == nil {
		var spec watchSpec
		if spec, err = a.limits.leaseWatch(all, q.Get("namespace"), q.Get("name"), start, etcdLocks, kubeKeys); err == nil {
			a.watchHTTP(w, r, spec, func(e *statemachine.Event) proto.Message { return leaseEventProto(e, kubeKeys) })
			return
		}
	}
	HTTPError(w, toConnect(err))
}

func (a *API) watchKeysHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	prefix, _ := strconv.ParseBool(q.Get("prefix"))
	start, err := queryRevision(q.Get("start_revision"))
	if err == nil {
		err = a.checkHTTP(r, &tenurev1.WatchRequest{Key: q.Get("key"), Prefix: prefix})
	}
	if err == nil {
		var spec watchSpec
		if spec, err = a.limits.keyWatch(q.Get("key"), prefix, start); err == nil {
			a.watchHTTP(w, r, spec, func(e *statemachine.Event) proto.Message { return keyEventProto(e) })
			return
		}
	}
	HTTPError(w, toConnect(err))
}

// checkHTTP checks an NDJSON endpoint's request as its Connect twin's,
// and audits a refusal with the code first ("permission_denied: ..."),
// as every other path writes it.
func (a *API) checkHTTP(r *http.Request, msg any) error {
	return toConnect(a.node.Check(r.Context(), r.URL.Path, msg))
}

func queryRevision(v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, Invalid("start_revision %q is not a number", v)
	}
	return n, nil
}

// watchHTTP registers the watcher, then sends 200 and the headers at once:
// a client sees the status as soon as the watch is in place (every event
// after it will be sent), and a bad request still gets a 4xx. The watch
// holds one of the caller's open-watch slots, as streamEvents does; a
// caller without one gets 429.
func (a *API) watchHTTP(w http.ResponseWriter, r *http.Request, spec watchSpec, render func(*statemachine.Event) proto.Message) {
	release, err := a.node.HoldWatch(r.Context())
	if err != nil {
		HTTPError(w, toConnect(err))
		return
	}
	defer release()
	watcher, err := a.openWatch(r.Context(), spec)
	if err != nil {
		HTTPError(w, toConnect(err))
		return
	}
	defer watcher.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	err = a.pumpEvents(r.Context(), watcher, spec, func(e *statemachine.Event) error {
		raw, err := protojson.Marshal(render(e))
		if err != nil {
			return err
		}
		// protojson varies its spacing on purpose; one compact line per
		// event is what line-oriented tools expect.
		var line bytes.Buffer
		if err := json.Compact(&line, raw); err != nil {
			return err
		}
		line.WriteByte('\n')
		if _, err := w.Write(line.Bytes()); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err == nil {
		return
	}
	// Headers are gone: the last line says why the stream ended.
	_, _ = w.Write([]byte(`{"error":` + strconv.Quote(err.Error()) + "}\n"))
}

// HTTPError answers a plain HTTP request with err's code as its status,
// its reason header and its message.
func HTTPError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	var ce *connect.Error
	if errors.As(err, &ce) {
		status = httpStatus(ce.Code())
		if name := ce.Meta().Get(api.ErrorHeader); name != "" {
			w.Header().Set(api.ErrorHeader, name)
		}
	}
	http.Error(w, err.Error(), status)
}

// httpStatus follows the connect protocol's code-to-status table.
func httpStatus(c connect.Code) int {
	switch c {
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeFailedPrecondition, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

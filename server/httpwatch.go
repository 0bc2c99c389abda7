package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// The connect streaming protocol frames every message in a binary
// envelope, which plain curl shows as noise. These endpoints stream the
// same events as newline-delimited JSON, one event per line, flushed as
// they happen:
//
//	curl -N 'http://127.0.0.1:7480/v1/watch/leases?namespace=default'
//	curl -N 'http://127.0.0.1:7480/v1/watch/keys?key=jobs/&prefix=true&start_revision=1'

func (s *Server) watchLeasesHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns := ""
	if all, _ := strconv.ParseBool(q.Get("all_namespaces")); !all {
		var err error
		if ns, err = s.cfg.Limits.namespace(q.Get("namespace")); err != nil {
			httpError(w, toConnect(err))
			return
		}
	}
	name := q.Get("name")
	if name != "" {
		if err := s.cfg.Limits.leaseName(name); err != nil {
			httpError(w, toConnect(err))
			return
		}
	}
	s.watchHTTP(w, r, leaseFilter(ns, name), func(e *statemachine.Event) proto.Message { return leaseEventProto(e) })
}

func (s *Server) watchKeysHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	prefix, _ := strconv.ParseBool(q.Get("prefix"))
	key := q.Get("key")
	if err := (&kvService{s}).watchKey(key, prefix); err != nil {
		httpError(w, toConnect(err))
		return
	}
	s.watchHTTP(w, r, watch.KeyFilter(key, prefix), func(e *statemachine.Event) proto.Message { return keyEventProto(e) })
}

// watchHTTP registers the watcher, then sends 200 and the headers at once:
// a client sees the status as soon as the watch is in place (every event
// after it will be sent), and a bad request still gets a 4xx.
func (s *Server) watchHTTP(w http.ResponseWriter, r *http.Request, filter func(*statemachine.Event) bool, render func(*statemachine.Event) proto.Message) {
	var start int64
	if v := r.URL.Query().Get("start_revision"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			httpError(w, toConnect(invalid("start_revision %q is not a number", v)))
			return
		}
		start = n
	}
	if start < 0 {
		httpError(w, toConnect(invalid("start_revision %d is negative", start)))
		return
	}
	watcher, err := s.hub.Watch(start, filter)
	if err != nil {
		httpError(w, toConnect(err))
		return
	}
	defer watcher.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	err = s.pumpEvents(r.Context(), watcher, func(e *statemachine.Event) error {
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

// pumpEvents feeds w's events to send until the caller goes away (nil),
// the server stops (nil), send fails, or the watcher falls behind (an
// explicit error naming the revision to resync from). It runs on the
// request's goroutine and starts one goroutine that ends with it. The
// Connect watches (streamEvents) and the NDJSON ones share it; it is
// split from the registration so that watchHTTP can answer in between.
func (s *Server) pumpEvents(ctx context.Context, w *watch.Watcher, send func(*statemachine.Event) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.stopC:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		e, err := w.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return toConnect(err)
		}
		if err := send(&e); err != nil {
			return err
		}
	}
}

func httpError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	var ce *connect.Error
	if errors.As(err, &ce) {
		status = httpStatus(ce.Code())
		if name := ce.Meta().Get(ErrorHeader); name != "" {
			w.Header().Set(ErrorHeader, name)
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
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

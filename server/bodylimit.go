package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// limitBodies guards every route against two ways a client can hold the
// server with a request body, before any handler sees it:
//
//   - A declared Content-Length over maxBytes is refused at once with 413
//     naming the limit. connect would read the first maxBytes+1 bytes and
//     discard up to 4 MiB more before saying the same; a client that
//     declares 1 GiB gets its answer without sending a byte of it.
//   - A body must arrive within readTimeout (0: no bound), or the read
//     fails and the call ends with deadline_exceeded. The deadline is
//     lifted once the body is read, so a unary call may then take as long
//     as it needs (a waiting Acquire parks for minutes). Requests whose
//     body is a stream that lasts as long as the call — client-streaming
//     and bidirectional methods, such as KeepAlive — are exempt, and so
//     are requests without a body (the NDJSON watches).
//
// http.Server.ReadTimeout would bound every body, KeepAlive's included,
// from the start of the request: it would cut every heartbeat stream
// after the timeout.
func limitBodies(next http.Handler, maxBytes int, readTimeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		if limit := requestBytesLimit(r, maxBytes); limit > 0 && r.ContentLength > limit {
			refuseTooLarge(w, r, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
				"request body of %d bytes (Content-Length) is over the limit of %d bytes (--max-request-bytes)", r.ContentLength, maxBytes)))
			return
		}
		if readTimeout > 0 && !clientStreams[r.URL.Path] {
			rc := http.NewResponseController(w)
			// net/http's writers, HTTP/1 and HTTP/2, all set deadlines;
			// one that cannot leaves the body unbounded.
			if err := rc.SetReadDeadline(time.Now().Add(readTimeout)); err == nil {
				r.Body = &deadlineBody{body: r.Body, rc: rc, timeout: readTimeout}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// envelopeBytes is the prefix gRPC, gRPC-Web and connect streaming put
// before each message; connect's unary protocol sends the bare message.
const envelopeBytes = 5

// requestBytesLimit is the largest body a request of r's protocol may
// declare with messages of at most maxBytes; 0 for no limit.
func requestBytesLimit(r *http.Request, maxBytes int) int64 {
	if maxBytes <= 0 {
		return 0
	}
	if enveloped(r) {
		return int64(maxBytes) + envelopeBytes
	}
	return int64(maxBytes)
}

func enveloped(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	return strings.HasPrefix(ct, "application/grpc") || strings.HasPrefix(ct, "application/connect+")
}

// refuseTooLarge answers 413 with connect's JSON error body, which curl
// shows and connect's unary protocol reads as resource_exhausted. gRPC
// and streaming clients expect their own error framing, which connect's
// ErrorWriter writes.
func refuseTooLarge(w http.ResponseWriter, r *http.Request, err *connect.Error) {
	if r.ProtoMajor == 1 {
		// The body is never read, so the connection cannot carry another
		// request; without this, net/http would read up to 256 KiB of
		// it, with no deadline, to keep the connection. (Over HTTP/2 the
		// stream is reset, and Connection: close would end the whole
		// connection and every stream on it.)
		w.Header().Set("Connection", "close")
	}
	if enveloped(r) {
		if ew := connect.NewErrorWriter(); ew.IsSupported(r) {
			_ = ew.Write(w, r, err)
			return
		}
	}
	body, _ := json.Marshal(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{err.Code().String(), err.Message()})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	_, _ = w.Write(body)
}

// deadlineBody lifts the read deadline when the body has been read to
// its end. It is read by the handler's goroutine only.
type deadlineBody struct {
	body    io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	done    bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF && !b.done {
		// Over HTTP/1.1 the server starts a background read of the
		// connection at the body's end, to notice a client that goes
		// away; a deadline left in place would fail it and cancel the
		// call's context.
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf(
			"request body not received within %v (--request-read-timeout)", b.timeout))
	}
	return n, err
}

func (b *deadlineBody) Close() error { return b.body.Close() }

// clientStreams holds the HTTP paths of the methods whose request is a
// stream (KeepAlive): their bodies last as long as the call.
var clientStreams = func() map[string]bool {
	paths := map[string]bool{}
	services := tenurev1.File_tenure_v1_tenure_proto.Services()
	for i := range services.Len() {
		svc := services.Get(i)
		methods := svc.Methods()
		for j := range methods.Len() {
			if m := methods.Get(j); m.IsStreamingClient() {
				paths[procedure(svc, m)] = true
			}
		}
	}
	return paths
}()

func procedure(svc protoreflect.ServiceDescriptor, m protoreflect.MethodDescriptor) string {
	return "/" + string(svc.FullName()) + "/" + string(m.Name())
}

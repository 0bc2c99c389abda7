package fence_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tenurehq/tenure/fence"
)

const (
	writeProc  = "/fence.test.v1.Resource/Write"  // unary: answers the accepted token
	followProc = "/fence.test.v1.Resource/Follow" // server stream: the token, twice
	uploadProc = "/fence.test.v1.Resource/Upload" // client stream: the messages received, joined
)

type (
	msg  = wrapperspb.StringValue
	conn = connect.Client[msg, msg]
)

// resource serves a fenced Connect service over 127.0.0.1 and returns
// its clients, made with opts, and a count of requests that reached it.
func resource(t *testing.T, p fence.Policy, opts ...connect.ClientOption) (write, follow, upload *conn, requests func() int64) {
	t.Helper()
	token := func(ctx context.Context) string {
		tok, ok := fence.FromContext(ctx)
		if !ok {
			return "no token"
		}
		return fence.Format(tok)
	}
	fenced := connect.WithInterceptors(fence.Interceptor(p))
	mux := http.NewServeMux()
	mux.Handle(writeProc, connect.NewUnaryHandler(writeProc, func(ctx context.Context, _ *connect.Request[msg]) (*connect.Response[msg], error) {
		return connect.NewResponse(wrapperspb.String(token(ctx))), nil
	}, fenced))
	mux.Handle(followProc, connect.NewServerStreamHandler(followProc, func(ctx context.Context, _ *connect.Request[msg], st *connect.ServerStream[msg]) error {
		for range 2 {
			if err := st.Send(wrapperspb.String(token(ctx))); err != nil {
				return err
			}
		}
		return nil
	}, fenced))
	mux.Handle(uploadProc, connect.NewClientStreamHandler(uploadProc, func(ctx context.Context, st *connect.ClientStream[msg]) (*connect.Response[msg], error) {
		var got []string
		for st.Receive() {
			got = append(got, st.Msg().GetValue())
		}
		if err := st.Err(); err != nil {
			return nil, err
		}
		return connect.NewResponse(wrapperspb.String(token(ctx) + " " + strings.Join(got, ","))), nil
	}, fenced))
	srv, n := countingServer(t, mux)
	hc := srv.Client()
	return connect.NewClient[msg, msg](hc, srv.URL+writeProc, opts...),
		connect.NewClient[msg, msg](hc, srv.URL+followProc, opts...),
		connect.NewClient[msg, msg](hc, srv.URL+uploadProc, opts...),
		n.Load
}

func TestInterceptor(t *testing.T) {
	tests := []struct {
		name   string
		header string // "" for none
		code   connect.Code
		msg    string
	}{
		{"a call without the header is an invalid argument", "", connect.CodeInvalidArgument, "the Tenure-Fence header is required"},
		{"a malformed token is an invalid argument", "default/db-writer", connect.CodeInvalidArgument, "no ':' before the token"},
		{"a stale token fails its precondition", "default/db-writer:1", connect.CodeFailedPrecondition, "stale fencing token default/db-writer:1: the current holder's token is 9"},
		{"an undecidable token is unavailable", "default/db-writer:2", connect.CodeUnavailable, "tenure is down"},
		{"a good token reaches the handler", "default/db-writer:5", 0, "default/db-writer:5"},
	}
	write, follow, _, _ := resource(t, byToken)
	ctx := context.Background()
	for _, tt := range tests {
		t.Run("unary: "+tt.name, func(t *testing.T) {
			req := connect.NewRequest(wrapperspb.String("v"))
			if tt.header != "" {
				req.Header().Set(fence.Header, tt.header)
			}
			resp, err := write.CallUnary(ctx, req)
			if tt.code == 0 {
				if err != nil || resp.Msg.GetValue() != tt.msg {
					t.Fatalf("got = %v, %v, expected: %q", resp, err, tt.msg)
				}
				return
			}
			if connect.CodeOf(err) != tt.code || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got = %v, expected: %v saying %q", err, tt.code, tt.msg)
			}
		})
		t.Run("stream: "+tt.name, func(t *testing.T) {
			req := connect.NewRequest(wrapperspb.String("v"))
			if tt.header != "" {
				req.Header().Set(fence.Header, tt.header)
			}
			st, err := follow.CallServerStream(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var got []string
			for st.Receive() {
				got = append(got, st.Msg().GetValue())
			}
			err = st.Err()
			if tt.code == 0 {
				if err != nil || strings.Join(got, ",") != tt.msg+","+tt.msg {
					t.Fatalf("got = %v, %v, expected: %q twice", got, err, tt.msg)
				}
				return
			}
			if len(got) > 0 || connect.CodeOf(err) != tt.code || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got = %v, %v, expected: nothing and %v saying %q", got, err, tt.code, tt.msg)
			}
		})
	}
}

func TestClientInterceptor(t *testing.T) {
	ctx := context.Background()
	src := newSource(tok("default", "db-writer", 5), true)
	write, follow, upload, requests := resource(t, fence.Monotonic(fence.NewMemoryStore()),
		connect.WithInterceptors(fence.ClientInterceptor(src)))

	t.Run("unary calls carry the token", func(t *testing.T) {
		req := connect.NewRequest(wrapperspb.String("v"))
		req.Header().Set(fence.Header, "default/forged:999") // replaced, not added
		resp, err := write.CallUnary(ctx, req)
		if err != nil || resp.Msg.GetValue() != "default/db-writer:5" {
			t.Fatalf("got = %v, %v, expected: default/db-writer:5", resp, err)
		}
	})
	t.Run("streams carry the token", func(t *testing.T) {
		st, err := follow.CallServerStream(ctx, connect.NewRequest(wrapperspb.String("v")))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if !st.Receive() || st.Msg().GetValue() != "default/db-writer:5" {
			t.Fatalf("got = %v, %v, expected: default/db-writer:5", st.Msg(), st.Err())
		}
	})
	t.Run("a client stream stops sending when the grant is lost", func(t *testing.T) {
		st := upload.CallClientStream(ctx)
		if err := st.Send(wrapperspb.String("a")); err != nil {
			t.Fatal(err)
		}
		src.set(tok("default", "db-writer", 5), false)
		defer src.set(tok("default", "db-writer", 5), true)
		if err := st.Send(wrapperspb.String("b")); !errors.Is(err, fence.ErrNotHolding) || connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("got = %v, expected: FailedPrecondition wrapping ErrNotHolding", err)
		}
		resp, err := st.CloseAndReceive()
		if err != nil || resp.Msg.GetValue() != "default/db-writer:5 a" {
			t.Fatalf("got = %v, %v, expected: only a received", resp, err)
		}
	})
	t.Run("a client stream stops sending when the token changes", func(t *testing.T) {
		st := upload.CallClientStream(ctx)
		if err := st.Send(wrapperspb.String("a")); err != nil {
			t.Fatal(err)
		}
		src.set(tok("default", "db-writer", 6), true) // lost and granted again
		if err := st.Send(wrapperspb.String("b")); !errors.Is(err, fence.ErrNotHolding) || !strings.Contains(err.Error(), "opened with default/db-writer:5") {
			t.Fatalf("got = %v, expected: ErrNotHolding naming the stream's token", err)
		}
		if _, err := st.CloseAndReceive(); err != nil {
			t.Fatal(err)
		}
	})

	src.set(tok("default", "db-writer", 6), false)
	before := requests()
	t.Run("an invalid token sends no unary call", func(t *testing.T) {
		_, err := write.CallUnary(ctx, connect.NewRequest(wrapperspb.String("v")))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !errors.Is(err, fence.ErrNotHolding) {
			t.Fatalf("got = %v, expected: FailedPrecondition wrapping ErrNotHolding", err)
		}
	})
	t.Run("an invalid token opens no server stream", func(t *testing.T) {
		_, err := follow.CallServerStream(ctx, connect.NewRequest(wrapperspb.String("v")))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !errors.Is(err, fence.ErrNotHolding) {
			t.Fatalf("got = %v, expected: FailedPrecondition wrapping ErrNotHolding", err)
		}
	})
	t.Run("an invalid token opens no client stream", func(t *testing.T) {
		st := upload.CallClientStream(ctx)
		if err := st.Send(wrapperspb.String("a")); !errors.Is(err, fence.ErrNotHolding) {
			t.Fatalf("got = %v, expected: ErrNotHolding", err)
		}
		if _, err := st.CloseAndReceive(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("got = %v, expected: FailedPrecondition", err)
		}
	})
	if n := requests() - before; n != 0 {
		t.Fatalf("got = %d requests at the server with an invalid token, expected: none", n)
	}
}

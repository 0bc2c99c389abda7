package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// Expected outcomes of a matrix cell.
const (
	ok      = "ok"                // answered without error
	allowed = "allowed"           // past the gate: any answer but the two below
	unauth  = "unauthenticated"   // connect.CodeUnauthenticated, HTTP 401
	denied  = "permission_denied" // connect.CodePermissionDenied, HTTP 403
	// notFound is connect.CodeNotFound: a session the caller may not
	// see is answered as one that does not exist.
	notFound = "not_found"
)

type matrixCall struct {
	name     string
	mutation bool
	call     func(ctx context.Context, c *authClients, f fixture) error
}

// codeOf is the outcome of a call's error as the matrix names it.
func codeOf(err error) string {
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		return unauth
	case connect.CodePermissionDenied:
		return denied
	case connect.CodeNotFound:
		return notFound
	}
	if err == nil {
		return ok
	}
	return "error: " + err.Error()
}

func httpCall(path string) func(ctx context.Context, c *authClients, f fixture) error {
	return func(ctx context.Context, c *authClients, f fixture) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url+path, nil)
		resp, err := c.http.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return nil
		case http.StatusUnauthorized:
			return connect.NewError(connect.CodeUnauthenticated, errors.New(resp.Status))
		case http.StatusForbidden:
			return connect.NewError(connect.CodePermissionDenied, errors.New(resp.Status))
		}
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
}

var matrixCalls = []matrixCall{
	{"SessionService/Open", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
		return err
	}},
	{"SessionService/KeepAlive", false, func(ctx context.Context, c *authClients, f fixture) error {
		s := c.sessions.KeepAlive(ctx)
		defer s.CloseResponse()
		if err := s.Send(&tenurev1.KeepAliveRequest{SessionId: f.session}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err := s.Receive()
		return err
	}},
	{"SessionService/Refresh", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.Refresh(ctx, connect.NewRequest(&tenurev1.KeepAliveRequest{SessionId: f.session}))
		return err
	}},
	{"SessionService/Get", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: f.session}))
		return err
	}},
	{"SessionService/List", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.List(ctx, connect.NewRequest(&tenurev1.ListSessionsRequest{}))
		return err
	}},
	{"SessionService/Pipeline", true, func(ctx context.Context, c *authClients, f fixture) error {
		s := c.sessions.Pipeline(ctx)
		defer s.CloseResponse()
		if err := s.Send(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_SetValue{SetValue: &tenurev1.SetValueRequest{
			Namespace: "team-a", Name: f.lease, Token: f.token, Value: "piped",
		}}}); err != nil && !errors.Is(err, io.EOF) {
			return err // io.EOF: refused; Receive says why
		}
		res, err := s.Receive()
		if err != nil {
			return err
		}
		if e := res.GetError(); e != nil {
			return connect.NewError(connect.Code(e.Code), errors.New(e.Message))
		}
		return nil
	}},
	{"LeaseService/Acquire", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: f.session, Namespace: "team-a", Name: f.lease + "-more"}))
		return err
	}},
	{"LeaseService/SetValue", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.SetValue(ctx, connect.NewRequest(&tenurev1.SetValueRequest{Namespace: "team-a", Name: f.lease, Token: f.token, Value: "x"}))
		return err
	}},
	{"LeaseService/Get", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Namespace: "team-a", Name: f.lease}))
		return err
	}},
	{"LeaseService/List", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{Namespace: "team-a"}))
		return err
	}},
	{"LeaseService/List all namespaces", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{AllNamespaces: true}))
		return err
	}},
	{"LeaseService/Validate", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Namespace: "team-a", Name: f.lease, Token: f.token}))
		return err
	}},
	{"LeaseService/Watch", false, func(ctx context.Context, c *authClients, f fixture) error {
		return firstMessage(c.leases.Watch(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{Namespace: "team-a", StartRevision: 1})))
	}},
	{"KVService/Get", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: f.key}))
		return err
	}},
	{"KVService/ValidateKey", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.ValidateKey(ctx, connect.NewRequest(&tenurev1.ValidateKeyRequest{Key: f.key, Revision: 2}))
		return err
	}},
	{"KVService/Range", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: "team-a/"}))
		return err
	}},
	{"KVService/CompareAndSwap", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{Key: f.key, Value: "swapped",
			Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Value{Value: "v"}}}))
		return err
	}},
	{"KVService/Put", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: f.key, Value: "changed"}))
		return err
	}},
	{"KVService/Watch", false, func(ctx context.Context, c *authClients, f fixture) error {
		return firstMessage(c.kv.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: "team-a/", Prefix: true, StartRevision: 1})))
	}},
	{"ClusterService/Members", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.Members(ctx, connect.NewRequest(&tenurev1.MembersRequest{}))
		return err
	}},
	{"ClusterService/Status", false, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
		return err
	}},
	// The cluster changes are made invalid on purpose, so that an
	// admin's call passes the gate and fails after it, leaving the
	// one-node cluster as it was.
	{"ClusterService/Join", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.Join(ctx, connect.NewRequest(&tenurev1.JoinRequest{}))
		return err
	}},
	{"ClusterService/Introduce", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.Introduce(ctx, connect.NewRequest(&tenurev1.IntroduceRequest{}))
		return err
	}},
	{"ClusterService/RemoveMember", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.RemoveMember(ctx, connect.NewRequest(&tenurev1.RemoveMemberRequest{Id: "no-such-node"}))
		return err
	}},
	{"ClusterService/TransferLeadership", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.cluster.TransferLeadership(ctx, connect.NewRequest(&tenurev1.TransferLeadershipRequest{Id: "no-such-node"}))
		return err
	}},
	{"ClusterService/Snapshot", false, func(ctx context.Context, c *authClients, f fixture) error {
		return firstMessage(c.cluster.Snapshot(ctx, connect.NewRequest(&tenurev1.SnapshotRequest{})))
	}},
	{"GET /v1/watch/leases", false, httpCall("/v1/watch/leases?namespace=team-a&start_revision=1")},
	{"GET /v1/watch/keys", false, httpCall("/v1/watch/keys?key=team-a/&prefix=true&start_revision=1")},
	{"GET /metrics", false, httpCall("/metrics")},
	{"GET /healthz", false, httpCall("/healthz")},
	{"GET /livez", false, httpCall("/livez")},
	{"GET /readyz", false, httpCall("/readyz")},
	{"GET / (the page)", false, httpCall("/")},
	{"LeaseService/SetPreferredHolder", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.SetPreferredHolder(ctx, connect.NewRequest(&tenurev1.SetPreferredHolderRequest{Namespace: "team-a", Name: f.lease, Identity: "team-a/standby"}))
		return err
	}},
	// Last: they end the fixture.
	{"LeaseService/Release", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: "team-a", Name: f.lease, Token: f.token}))
		return err
	}},
	{"LeaseService/Revoke", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.leases.Revoke(ctx, connect.NewRequest(&tenurev1.RevokeRequest{Namespace: "team-a", Name: f.revocable, Reason: "matrix"}))
		return err
	}},
	{"KVService/Delete", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.kv.Delete(ctx, connect.NewRequest(&tenurev1.DeleteRequest{Key: f.key}))
		return err
	}},
	{"SessionService/Close", true, func(ctx context.Context, c *authClients, f fixture) error {
		_, err := c.sessions.Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: f.session}))
		return err
	}},
}

// open are the endpoints anybody may call: probes and the page itself.
var openEndpoints = map[string]bool{"GET /healthz": true, "GET /livez": true, "GET /readyz": true, "GET / (the page)": true}

// expected is what each caller must get from each call on team-a's
// resources.
func expected(caller, call string) string {
	if openEndpoints[call] {
		return ok
	}
	switch caller {
	case "no credentials", "unknown token", "expired token", "expired certificate", "foreign-CA certificate":
		return unauth
	case "admin token", "admin certificate":
		switch call {
		// An admin may break in, but never act as the holder.
		case "SessionService/KeepAlive", "SessionService/Refresh", "LeaseService/Acquire",
			"LeaseService/SetValue", "SessionService/Pipeline":
			return denied
		case "ClusterService/Join", "ClusterService/Introduce", "ClusterService/RemoveMember", "ClusterService/TransferLeadership":
			return allowed
		}
		return ok
	case "read-only principal":
		switch call {
		case "SessionService/Get", "SessionService/List", "LeaseService/Get", "LeaseService/List",
			"LeaseService/List all namespaces", "LeaseService/Validate", "LeaseService/Watch",
			"KVService/Get", "KVService/ValidateKey", "KVService/Range", "KVService/Watch", "ClusterService/Members",
			"ClusterService/Status", "GET /v1/watch/leases", "GET /v1/watch/keys", "GET /metrics":
			return ok
		}
		return denied
	case "lock principal of another namespace":
		switch call {
		case "SessionService/Get":
			return notFound
		// Its own session; lists filtered to what it may read.
		case "SessionService/Open", "SessionService/List", "LeaseService/List all namespaces",
			"ClusterService/Members", "ClusterService/Status", "GET /metrics":
			return ok
		}
		return denied
	case "validate-only principal":
		switch call {
		case "SessionService/Get":
			return notFound
		case "LeaseService/Validate", "SessionService/List", "LeaseService/List all namespaces",
			"ClusterService/Members", "ClusterService/Status", "GET /metrics":
			return ok
		}
		return denied
	}
	panic("no expectations for " + caller)
}

// TestEveryEndpointAnswersEachCallerExactlyAsThePolicySays is the
// authorization matrix: every RPC and HTTP endpoint, called on team-a's
// session, lease and key by callers without credentials, with a token
// the policy does not know or that expired, with an expired or a
// foreign CA's certificate, and as a reader, a lock principal of another
// namespace, a validate-only principal and an admin (by token and by
// certificate). Each answers exactly the expected code, and a refused
// mutation leaves the store's revision where it was.
func TestEveryEndpointAnswersEachCallerExactlyAsThePolicySays(t *testing.T) {
	t.Parallel()
	as := startAuthServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	callers := []struct{ name, credentials string }{
		{"no credentials", ""},
		{"unknown token", "token:tnr_not-a-token-the-policy-knows"},
		{"expired token", "token:retired"},
		{"expired certificate", "cert:expired"},
		{"foreign-CA certificate", "foreign"},
		{"read-only principal", "token:reader"},
		{"lock principal of another namespace", "cert:team-b"},
		{"validate-only principal", "token:validator"},
		{"admin token", "token:admin"},
		{"admin certificate", "cert:client"},
	}
	for row, caller := range callers {
		t.Run(caller.name, func(t *testing.T) {
			f := as.fixture(t, ctx, row)
			c := as.clients(t, caller.credentials)
			for _, call := range matrixCalls {
				want := expected(caller.name, call.name)
				before := as.revision(t, ctx)
				callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := call.call(callCtx, c, f)
				cancel()
				got := codeOf(err)
				if want == allowed {
					if got == unauth || got == denied {
						t.Errorf("%s: got = %s (%v), expected: past the gate", call.name, got, err)
					}
				} else if got != want {
					t.Errorf("%s: got = %s, expected: %s", call.name, got, want)
				}
				if call.mutation && (want == unauth || want == denied) {
					if after := as.revision(t, ctx); after != before {
						t.Errorf("%s refused, yet the revision moved from %d to %d", call.name, before, after)
					}
				}
			}
		})
	}
	// Every refusal is in the audit trail with its principal; no token
	// is anywhere in the logs.
	logs := as.logs.String()
	for _, want := range []string{`principal=reader action=/tenure.v1.KVService/Put target=team-a/k-5 outcome=denied`, `action=/tenure.v1.LeaseService/Revoke target=team-a/job-8-r outcome=allowed`} {
		if !strings.Contains(logs, want) {
			t.Errorf("audit log lacks %q", want)
		}
	}
	for name, tok := range as.tokens {
		if strings.Contains(logs, tok) || strings.Contains(logs, tok[len(tok)/2:]) {
			t.Errorf("the logs hold %s's token", name)
		}
	}
}

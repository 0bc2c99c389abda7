package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/internal/attack"
	"github.com/tenurehq/tenure/internal/certs"
)

const attackPolicy = `
principals:
  - name: admin
    roles: [admin]
    tokens: [{sha256: "%s"}]
  - name: team-a
    roles: [team-a, shared]
    tokens: [{sha256: "%s"}]
  - name: team-b
    roles: [team-b, shared]
    tokens: [{sha256: "%s"}]
  - name: reader
    roles: [reader]
    tokens: [{sha256: "%s"}]
roles:
  admin:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read, lock, write, admin]
  reader:
    - namespaces: ["*"]
      keys: ["*"]
      verbs: [read]
  team-a:
    - namespaces: [team-a]
      verbs: [read, lock]
    - keys: [team-a/]
      verbs: [read, write]
  team-b:
    - namespaces: [team-b]
      verbs: [read, lock]
    - keys: [team-b/]
      verbs: [read, write]
  shared:
    - namespaces: [shared]
      verbs: [read, lock]
`

// TestNoPrincipalWinsARaceThroughAFollowerOfASecureCluster runs the
// attacks of issue 21 on three `tenure serve` processes with API TLS,
// peer TLS and a policy: team-b, and a reader, aim Close, Acquire,
// Release, SetValue, Put and CompareAndSwap at the IDs team-a is about
// to get, from eight goroutines, through a follower, while team-a works
// through the same follower; then team-b heartbeats the next IDs on the
// leader before team-a opens a session it never heartbeats itself.
// Nothing of team-a's is touched, and its session expires on time.
func TestNoPrincipalWinsARaceThroughAFollowerOfASecureCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster of processes")
	}
	sc := startSecureCluster(t, func(i int, f func(string) string) []string {
		return []string{"--audit-log", f(fmt.Sprintf("audit%d.log", i+1)), "--min-ttl", "1s"}
	})
	f, tokens := sc.file, sc.tokens
	var follower, leaderAddr string
	for _, m := range sc.members {
		if m.ID == sc.leader {
			leaderAddr = m.APIAddress
		} else if follower == "" {
			follower = m.APIAddress
		}
	}
	tlsConfig, err := certs.ClientConfig(f("ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	party := func(principal, addr string) attack.Party {
		var p http.Protocols
		p.SetHTTP2(true)
		tr := &http.Transport{TLSClientConfig: tlsConfig.Clone(), Protocols: &p, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		token := tokens[principal]
		hc := &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+token)
			return tr.RoundTrip(r)
		})}
		return attack.NewParty(hc, "https://"+addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, attacker := range []string{"team-b", "reader"} {
		rep, err := attack.Race{
			Victim: party("team-a", follower), Attacker: party(attacker, follower), Observer: party("admin", leaderAddr),
			SharedNamespace: "shared", AttackerNamespace: "team-b", AttackerKeys: "team-b/",
			Sessions: 30, Goroutines: 8, Ahead: 4,
		}.Run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s through a follower: %s", attacker, rep)
		if !rep.Empty() {
			t.Errorf("what %s did to team-a through a follower: got = %s, expected: nothing", attacker, rep)
		}
		if rep.Refused == 0 {
			t.Errorf("refused calls of %s: got = 0 of %d, expected: some", attacker, rep.Salvos)
		}
	}

	// Heartbeats are served by the leader alone.
	admin, victim, attacker := party("admin", leaderAddr), party("team-a", leaderAddr), party("team-b", leaderAddr)
	r, err := admin.KV.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Limit: 1}))
	if err != nil {
		t.Fatal(err)
	}
	rev := r.Msg.GetGlobalRevision() // the next session IDs
	var denied atomic.Int64
	beatCtx, stopBeating := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		denied.Store(attack.Heartbeats(beatCtx, attacker, func() []int64 { return []int64{rev + 1, rev + 2, rev + 3, rev + 4} }, 100*time.Millisecond))
	}()
	defer func() { stopBeating(); <-done }()
	time.Sleep(300 * time.Millisecond)
	open, err := victim.Sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(2 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	id := open.Msg.GetSession().GetId()
	if id > rev+4 {
		t.Fatalf("team-a's session ID: got = %d, expected: one team-b aims at (%d..%d)", id, rev+1, rev+4)
	}
	waitFor(t, 20*time.Second, fmt.Sprintf("team-a's session %d (TTL 2s, never heartbeated by team-a) to expire while team-b beats for it", id), func() bool {
		_, err := admin.Sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: id}))
		return connect.CodeOf(err) == connect.CodeNotFound
	})
	stopBeating()
	<-done
	if denied.Load() == 0 {
		t.Errorf("team-b's heartbeat streams refused: got = 0, expected: at least one")
	}
}

// secureCluster is three tenure serve processes with API TLS, peer TLS
// and attackPolicy, settled with a leader; the CLI's environment speaks
// to them as admin.
type secureCluster struct {
	nodes   []*clusterNode
	members []memberJSON
	leader  string
	tokens  map[string]string // principal → its token
	file    func(name string) string
}

// startSecureCluster starts it, each node also given extra(i, file).
func startSecureCluster(t *testing.T, extra func(i int, file func(string) string) []string) *secureCluster {
	t.Helper()
	bin := tenureBinary(t)
	dir := t.TempDir()
	sc := &secureCluster{tokens: map[string]string{}, file: func(name string) string { return filepath.Join(dir, name) }}
	f := sc.file
	if err := certs.Init(dir, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	var hashes []any
	for _, p := range []string{"admin", "team-a", "team-b", "reader"} {
		sc.tokens[p] = auth.NewToken()
		hashes = append(hashes, auth.HashToken(sc.tokens[p]))
	}
	if err := os.WriteFile(f("policy.yaml"), []byte(fmt.Sprintf(attackPolicy, hashes...)), 0o600); err != nil {
		t.Fatal(err)
	}
	sc.nodes = newClusterNodes(t, bin, 3)
	for i, n := range sc.nodes {
		n.args = append(n.args,
			"--cert-file", f("server.pem"), "--key-file", f("server-key.pem"), "--client-ca-file", f("client-ca.pem"),
			"--peer-cert-file", f("peer.pem"), "--peer-key-file", f("peer-key.pem"), "--peer-ca-file", f("ca.pem"),
			"--policy", f("policy.yaml"))
		n.args = append(n.args, extra(i, f)...)
		n.start()
	}
	t.Setenv("TENURE_CACERT", f("ca.pem"))
	t.Setenv("TENURE_TOKEN", sc.tokens["admin"])
	sc.members, sc.leader = settled(t, bin, endpointsOf(sc.nodes), 3, 0, 30*time.Second)
	return sc
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/statemachine"
)

// The etcd port speaks HTTP/1.1 beside gRPC, as etcd's client port does:
// etcd's JSON gateway under /v3/ (etcdapi.NewGateway), /health and
// /version. etcdListener (etcdlisten.go) tells the two apart on each
// connection; this file serves the HTTP side.
//
// The gateway reaches the gRPC server through an in-process connection
// (an in-memory listener the same grpc.Server serves), so each of its
// calls runs every interceptor a gRPC client's call runs: metrics,
// request sizes, authentication and forwarding to the leader. The gRPC
// server knows the connection by its address (gatewayAddr), and only
// from it believes the HTTP client's address the gateway passes on, for
// the audit log.

// etcdGateway is the HTTP side of the etcd port.
type etcdGateway struct {
	http   *http.Server
	inproc *bufconn.Listener
	conn   *grpc.ClientConn // to inproc
}

// gatewayAddr is the address of the gateway's in-process connection.
type gatewayAddr struct{}

func (gatewayAddr) Network() string { return "inproc" }
func (gatewayAddr) String() string  { return "etcd-gateway" }

// gatewayListener is the in-process listener, its connections named
// by gatewayAddr.
type gatewayListener struct{ *bufconn.Listener }

func (l gatewayListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return gatewayConn{c}, nil
}

type gatewayConn struct{ net.Conn }

func (gatewayConn) RemoteAddr() net.Addr { return gatewayAddr{} }

// gatewayBuffer is the in-process connection's buffer each way: gRPC's
// own read buffer.
const gatewayBuffer = 32 << 10

// startEtcdGateway builds the gateway over an in-process connection to
// s.etcd and starts serving it and the gRPC server on their listeners.
// The goroutines it starts are counted in s.wg; stopEtcdGateway ends
// them.
func (s *Server) startEtcdGateway(ln *etcdListener) error {
	g := &etcdGateway{inproc: bufconn.Listen(gatewayBuffer)}
	conn, err := grpc.NewClient("passthrough:///etcd-gateway",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return g.inproc.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		etcdForwardSizes)
	if err != nil {
		return err
	}
	g.conn = conn
	api, err := etcdapi.NewGateway(context.Background(), conn, etcdapi.GatewayMaxBody(s.cfg.Limits.EtcdMaxRequestBytes))
	if err != nil {
		_ = conn.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/v3/", s.gatewayGuard(api))
	mux.Handle("/v3beta/", s.gatewayGuard(api))
	mux.HandleFunc("/health", s.etcdHealth)
	mux.HandleFunc("/version", s.etcdVersion)
	g.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: time.Minute,
		ErrorLog:          log.New(io.Discard, "", 0), // as etcd: clients' mistakes are not the server's
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if st, ok := tlsState(c); ok {
				return context.WithValue(ctx, tlsStateKey{}, st)
			}
			return ctx
		},
	}
	s.etcdGW = g
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		s.serveEtcdGRPC(ln.grpc)
	}()
	go func() {
		defer s.wg.Done()
		s.serveEtcdGRPC(gatewayListener{g.inproc})
	}()
	go func() {
		defer s.wg.Done()
		if err := g.http.Serve(ln.http); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.reportEtcdErr(fmt.Errorf("etcd API (HTTP): %w", err))
		}
	}()
	return nil
}

func (s *Server) serveEtcdGRPC(ln net.Listener) {
	if err := s.etcd.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		s.reportEtcdErr(fmt.Errorf("etcd API: %w", err))
	}
}

func (s *Server) reportEtcdErr(err error) {
	select {
	case s.serveErr <- err:
	default:
	}
}

// stopEtcdGateway ends the HTTP side's requests within ctx, then cuts
// what is left (watches and keep-alives never end by themselves), and
// closes the in-process connection.
func (g *etcdGateway) stop(ctx context.Context) {
	_ = g.http.Shutdown(ctx)
	_ = g.http.Close()
	_ = g.conn.Close()
}

type tlsStateKey struct{}

// gatewayGuard refuses, as etcd's accessController does, a gateway
// request over TLS whose client certificate names a user while a
// policy is in force: the gateway's calls carry no certificate, and
// etcd will not let such a client believe its certificate counts.
// Credentials go in the Authorization header.
func (s *Server) gatewayGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st, ok := r.Context().Value(tlsStateKey{}).(tls.ConnectionState); ok && s.policyOn() {
			// etcd looks at verified chains; with a policy Tenure's
			// handshake leaves the checking to package auth.
			if len(st.PeerCertificates) > 0 && st.PeerCertificates[0].Subject.CommonName != "" {
				http.Error(w, "CommonName of client sending a request against gateway will be ignored and not used as expected", http.StatusBadRequest)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// etcdHealth answers /health as etcd 3.5 does (etcdhttp/health.go):
// GET only; {"health":"true","reason":""}, or 503 and "false" with the
// reason: an alarm not excluded by ?exclude=NOSPACE ("ALARM NOSPACE"),
// no leader unless ?serializable=true ("RAFT NO LEADER"), or a read
// that fails ("RANGE ERROR:..."). etcd reads a key as its root user;
// Tenure reads its state through the node: on the leader a
// linearizable read (raft's read index), on a follower the leader's
// commit index (raftnode.Node.Sync), or this node's state when
// serializable. No call is counted or audited: a probe is no client.
func (s *Server) etcdHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	exclude := map[string]bool{}
	for _, a := range r.URL.Query()["exclude"] {
		exclude[a] = true
	}
	serializable := r.URL.Query().Get("serializable") == "true"
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	reason := s.etcdUnhealthy(ctx, exclude, serializable)
	d, _ := json.Marshal(struct {
		Health string `json:"health"`
		Reason string `json:"reason"`
	}{fmt.Sprint(reason == ""), reason})
	if reason != "" {
		http.Error(w, string(d), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write(d)
}

// healthTimeout bounds /health's read, as etcd's request timeout does.
const healthTimeout = 5 * time.Second

// etcdUnhealthy is why /health answers false, or "".
func (s *Server) etcdUnhealthy(ctx context.Context, exclude map[string]bool, serializable bool) string {
	alarms, err := etcdBackend{frontNode{s}}.Alarms(ctx)
	if err != nil {
		return "RANGE ERROR:" + err.Error()
	}
	if s.node.DiskFull() != nil {
		alarms = append(alarms, &pb.AlarmMember{Alarm: pb.AlarmType_NOSPACE})
	}
	for _, a := range alarms {
		if exclude[a.Alarm.String()] {
			continue
		}
		switch a.Alarm {
		case pb.AlarmType_NOSPACE:
			return "ALARM NOSPACE"
		case pb.AlarmType_CORRUPT:
			return "ALARM CORRUPT"
		default:
			return "ALARM UNKNOWN"
		}
	}
	if serializable {
		return ""
	}
	if s.node.Status().LeaderID == "" {
		return "RAFT NO LEADER"
	}
	if s.leading.Load() {
		err = s.read(ctx, false, func(*statemachine.Machine) error { return nil })
	} else {
		err = s.node.Sync(ctx)
	}
	if err != nil {
		return "RANGE ERROR:" + err.Error()
	}
	return ""
}

// etcdVersion answers /version as etcd does: {"etcdserver", "etcdcluster"}.
// The server's version is the one Maintenance Status reports (etcd's API
// level, Tenure's own version as build metadata); the cluster's is the
// etcd API level every member speaks.
func (s *Server) etcdVersion(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	d, _ := json.Marshal(struct {
		Server  string `json:"etcdserver"`
		Cluster string `json:"etcdcluster"`
	}{etcdapi.ServerVersion(s.cfg.Build.Version), etcdapi.ClusterVersion})
	_, _ = w.Write(d)
}

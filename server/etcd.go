package server

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/statemachine"
)

// EtcdConfig turns on the etcd v3 API (package etcdapi) on a listener of
// its own: gRPC over HTTP/2, with the API's TLS configuration when it
// has one.
type EtcdConfig struct {
	// Listener serves it; nil leaves it off. Close closes it.
	Listener net.Listener
	// Advertise is the address clients and other nodes reach it at
	// (default the listener's address): MemberList's client URL and
	// where followers forward what needs the leader.
	Advertise string
	// Compaction is the automatic compaction of the keys' history.
	Compaction Compaction
	// BcryptCost is the cost of the password hashes etcdctl's user add
	// and passwd store, as etcd's --bcrypt-cost (0: bcrypt's default,
	// 10, etcd's too).
	BcryptCost int
}

// etcdScheme is the URL scheme of the etcd API: https when it serves TLS.
func (s *Server) etcdScheme() string {
	if s.cfg.TLS != nil {
		return "https"
	}
	return "http"
}

// etcdStreamWorkers is how many goroutines gRPC keeps for the etcd API's
// calls.
const etcdStreamWorkers = 64

// startEtcd serves the etcd API when it is configured.
func (s *Server) startEtcd() error {
	ec := s.cfg.Etcd
	if ec.Listener == nil {
		return nil
	}
	if c := ec.BcryptCost; c != 0 && (c < bcrypt.MinCost || c > bcrypt.MaxCost) {
		return fmt.Errorf("etcd API: bcrypt cost %d is outside %d..%d (--bcrypt-cost)", c, bcrypt.MinCost, bcrypt.MaxCost)
	}
	if err := ec.Compaction.Validate(); err != nil {
		return err
	}
	// The metrics first, so that every call is counted, a refused one
	// too; then etcd's request and answer sizes: its interceptor refuses
	// a request too large before authentication and forwarding.
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(s.etcdMetricsUnary), grpc.ChainStreamInterceptor(s.etcdMetricsStream)}
	opts = append(opts, etcdapi.ServerOptions(s.cfg.Limits.EtcdMaxRequestBytes)...)
	opts = append(opts,
		grpc.ChainUnaryInterceptor(s.etcdUnaryInterceptors()...),
		grpc.ChainStreamInterceptor(s.etcdStreamInterceptors()...),
		// As etcd: clients' keep-alive pings every 5s or more are fine.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Calls run on kept goroutines, as the native pipeline's do
		// (nativeapi/pipeline.go): a goroutine per call grows its stack
		// from 8 KiB every time. gRPC starts one anyway when all are
		// busy, as they are while calls wait for their commit.
		grpc.NumStreamWorkers(etcdStreamWorkers),
	)
	if s.etcdTLS != nil {
		// The listener makes the handshake (etcdlisten.go).
		opts = append(opts, grpc.Creds(handshakenCreds{}))
	}
	s.etcd = grpc.NewServer(opts...)
	etcdapi.Register(s.etcd, etcdBackend{frontNode{s}})
	// gRPC and etcd's JSON gateway share the port (etcdgateway.go).
	s.etcdLn = newEtcdListener(ec.Listener, s.etcdTLS)
	if err := s.startEtcdGateway(s.etcdLn); err != nil {
		return err
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.etcdLn.serve(); err != nil {
			s.reportEtcdErr(fmt.Errorf("etcd API: %w", err))
		}
	}()
	go func() {
		defer s.wg.Done()
		s.compactionLoop(ec.Compaction)
	}()
	s.log.Info("etcd API serving", "addr", ec.Listener.Addr().String(), "advertise", s.etcdAdvertise, "auto_compaction", ec.Compaction.Mode)
	return nil
}

// etcdForwardSizes lets a follower's forwarded call carry whatever its
// etcd API took in and bring back whatever the leader's answers: gRPC's
// clients take answers of 4 MiB at most, and a Range may return many
// values of a megabyte, which etcd's own clients take (their limit, as
// etcd's server's, is gRPC's largest message).
var etcdForwardSizes = grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32))

// stopEtcd ends the etcd API's calls and streams: unary calls finish,
// streams are cut, as the HTTP server does them.
func (s *Server) stopEtcd() {
	if s.etcd == nil {
		return
	}
	if s.etcdLn != nil {
		s.etcdLn.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		s.etcd.GracefulStop()
		close(done)
	}()
	if s.etcdGW != nil {
		s.etcdGW.stop(ctx) // the gateway's streams are the gRPC server's too
	}
	select {
	case <-done:
	case <-ctx.Done():
		s.etcd.Stop()
		<-done
	}
}

// etcdBackend is the node as the etcd services see it: the node every
// API sees (frontNode), and what only etcd's services ask of it.
type etcdBackend struct{ frontNode }

// Propose waits out the moment after a new cluster's election when
// every member has registered a build that runs cluster version 5 but
// the leader has not yet raised it: etcd clients do not retry a refused
// write, and a new etcd cluster takes writes once it has a leader. The
// state machine refuses such a write at apply, changing nothing, so it
// is safe to propose it again. A cluster with an older member still
// answers "not capable", after the wait.
func (b etcdBackend) Propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error) {
	deadline := time.Now().Add(versionWait)
	for {
		res, err := b.frontNode.Propose(ctx, cmd)
		if !errors.Is(err, statemachine.ErrNotSupported) || time.Now().After(deadline) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, err
		case <-b.s.stopC:
			return res, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// versionWait bounds how long an etcd write waits for the cluster
// version: the leader raises it within a second of the last member's
// registration.
const versionWait = 5 * time.Second

func (b etcdBackend) Identity(ctx context.Context) string { return b.s.etcdIdentity(ctx) }

func (b etcdBackend) SessionTTL() (time.Duration, time.Duration) {
	return b.s.cfg.Limits.MinTTL, b.s.cfg.Limits.MaxTTL
}

func (b etcdBackend) Authenticate(ctx context.Context, name, password string) (string, error) {
	return b.s.etcdAuthenticate(ctx, name, password)
}

func (b etcdBackend) AuthEnabled() bool { return b.s.policyOn() }

// BcryptCost is --bcrypt-cost: the cost of the hashes etcd's users get.
func (b etcdBackend) BcryptCost() int {
	if c := b.s.cfg.Etcd.BcryptCost; c != 0 {
		return c
	}
	return bcrypt.DefaultCost
}

// PolicyFileNames: the policy file wins for the names it defines.
func (b etcdBackend) PolicyFileNames(name string) bool {
	return b.s.auth.authn.Policy.Policy().FileNames(name)
}

// Ident is in every response header, so it reads nothing that costs a
// trip through raft's loop: the cluster ID is cached (etcdIdent).
func (b etcdBackend) Ident() (cluster, member, term uint64) {
	return b.s.etcdIdent.clusterID(b.s), memberID(b.s.node.ID()), b.s.node.Term()
}

// etcdIdentCache holds the etcd cluster ID, which reading the raft
// configuration gives, for a few seconds: membership changes rarely.
type etcdIdentCache struct {
	mu      sync.Mutex
	id      uint64
	expires time.Time
}

func (c *etcdIdentCache) clusterID(s *Server) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.After(c.expires) {
		c.id, c.expires = s.etcdClusterID(), now.Add(5*time.Second)
	}
	return c.id
}

// memberID is the etcd member ID of a node ID: etcd's IDs are
// numbers, Tenure's are names.
func memberID(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// etcdClusterID names the cluster by the member that sorts first. Tenure
// has no cluster ID of its own; clients only show this one.
func (s *Server) etcdClusterID() uint64 {
	members, err := s.node.Members()
	if err != nil || len(members) == 0 {
		return memberID(s.node.ID())
	}
	ids := make([]string, 0, len(members))
	for _, m := range members {
		ids = append(ids, m.ID)
	}
	return memberID("cluster/" + slices.Min(ids))
}

func (b etcdBackend) Node(ctx context.Context) (etcdapi.NodeInfo, error) {
	s := b.s
	st := s.node.Status()
	info := etcdapi.NodeInfo{
		ClusterID: s.etcdClusterID(),
		MemberID:  memberID(st.ID),
		Name:      st.ID,
		RaftTerm:  st.Term,
		RaftIndex: st.CommitIndex,
		Applied:   st.AppliedIndex,
		DBSize:    s.node.DiskBytesInUse(),
		Version:   s.cfg.Build.Version,
	}
	if st.LeaderID != "" {
		info.LeaderID = memberID(st.LeaderID)
	}
	if err := s.node.DiskFull(); err != nil {
		info.NoSpace = err.Error()
	}
	members, err := s.node.Members()
	if err != nil {
		return info, nodeError(err)
	}
	etcdAddrs := map[string]string{}
	started := map[string]bool{st.ID: true}
	_ = s.node.ReadLocal(func(m *statemachine.Machine) error {
		for _, mem := range members {
			if a, ok := m.MemberEtcdAddress(mem.ID); ok {
				etcdAddrs[mem.ID] = a
			}
			if _, ok := m.MemberAddress(mem.ID); ok {
				started[mem.ID] = true
			}
		}
		return nil
	})
	if a := s.etcdAdvertise; a != "" {
		etcdAddrs[st.ID] = a // before its registration is applied
	}
	for _, mem := range members {
		em := etcdapi.Member{ID: memberID(mem.ID), Name: mem.ID, PeerURLs: []string{"http://" + mem.Address}, IsLearner: !mem.Voter}
		if !started[mem.ID] {
			// Added (etcd's MemberAdd) but never started: etcd names
			// such a member with "", and etcdctl shows it "unstarted".
			em.Name = ""
		}
		if s.cfg.Raft.PeerTLS != nil {
			em.PeerURLs = []string{"https://" + mem.Address}
		}
		if a, ok := etcdAddrs[mem.ID]; ok {
			em.ClientURLs = []string{s.etcdScheme() + "://" + a}
		}
		if mem.ID == st.ID {
			info.Learner = !mem.Voter
		}
		info.Members = append(info.Members, em)
	}
	return info, nil
}

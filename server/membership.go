package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/statemachine"
)

// How a node becomes and stays a member. Raft's configuration says who
// votes; the log also carries each member's API address (SetMember),
// which raft has no room for. A node:
//
//  1. forms a cluster or joins one, if its data dir holds none: with
//     --bootstrap-expect N it introduces itself to the --join addresses
//     until it has met N nodes, and all of them bootstrap the same N
//     voters (hashicorp/raft lets identical bootstraps meet); with --join
//     alone it asks any member to add it, as a non-voter;
//  2. keeps its entry right for as long as it runs: it registers its API
//     address whenever the log's differs (a restart on a new address),
//     and a non-voter asks to be promoted once it has applied what the
//     leader had committed when it joined, so it never votes before it
//     could help make a quorum.
//
// Every step is idempotent, so a restart with the same flags simply runs
// them again.

// discovery is what a node started with --bootstrap-expect has learnt of
// the others before a cluster exists.
type discovery struct {
	mu    sync.Mutex
	known map[string]*tenurev1.NodeInfo // by ID, this node included
}

func (d *discovery) add(n *tenurev1.NodeInfo) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.known == nil {
		d.known = map[string]*tenurev1.NodeInfo{}
	}
	d.known[n.GetId()] = n
}

func (d *discovery) list() []*tenurev1.NodeInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*tenurev1.NodeInfo, 0, len(d.known))
	for _, n := range d.known {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *tenurev1.NodeInfo) int { return strings.Compare(a.GetId(), b.GetId()) })
	return out
}

func (s *Server) selfInfo() *tenurev1.NodeInfo {
	return &tenurev1.NodeInfo{Id: s.node.ID(), PeerAddress: s.node.Addr(), ApiAddress: s.advertise, Engine: s.node.Engine()}
}

// engineOf is the consensus engine a node's message names: builds from
// before the etcd raft engine name none, and run hashicorp/raft.
func engineOf(engine string) string {
	if engine == "" {
		return raftnode.EngineHashicorp
	}
	return engine
}

// otherEngine is why node id, of engine, cannot be one cluster with
// other (a node, or "this cluster"), of theirs: the engines' peer
// protocols differ, so the two could exchange no raft traffic, and a
// configuration holding both could lose its quorum for good. The other
// engine is hashicorp/raft, which Tenure ran before the etcd raft engine;
// the message names the way across.
func otherEngine(id, engine, other, theirs string) error {
	return fmt.Errorf("%w: node %s runs the %s raft engine and %s the %s raft engine, whose peer protocols differ, and the nodes of a cluster all run one engine: "+
		"run one Tenure build on every node (builds before the etcd raft engine run hashicorp/raft), or, to move a cluster to this build, run tenure snapshot save against the old cluster, "+
		"then tenure snapshot restore into the data dir of the first node of a new cluster (docs/operations.md, \"Moving to another consensus engine\")",
		raftnode.ErrOtherEngine, id, engine, other, theirs)
}

func (h *clusterService) Introduce(ctx context.Context, req *connect.Request[tenurev1.IntroduceRequest]) (*connect.Response[tenurev1.IntroduceResponse], error) {
	n := req.Msg.GetNode()
	if n.GetId() == "" {
		return nil, toConnect(invalid("node.id is required"))
	}
	if err := checkPeerAddress("node.peer_address", n.GetPeerAddress()); err != nil {
		return nil, toConnect(err)
	}
	if err := checkHostPort("node.api_address", n.GetApiAddress()); err != nil {
		return nil, toConnect(err)
	}
	if e := engineOf(n.GetEngine()); e != h.s.node.Engine() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, otherEngine(n.GetId(), e, "node "+h.s.node.ID(), h.s.node.Engine()))
	}
	want, have := req.Msg.GetExpect(), h.s.cfg.BootstrapExpect
	if want > 0 && have > 0 && int(want) != have {
		return nil, toConnect(invalid("node %s expects %d voters, this node %s expects %d: start every node with the same --bootstrap-expect", n.GetId(), want, h.s.node.ID(), have))
	}
	out := &tenurev1.IntroduceResponse{Node: h.s.selfInfo(), Formed: h.s.node.Formed()}
	if !out.Formed {
		// A node is counted towards --bootstrap-expect only if raft
		// traffic with it can work.
		if err := h.s.node.CheckPeer(ctx, n.GetPeerAddress()); err != nil {
			return nil, connect.NewError(connect.CodePermissionDenied, err)
		}
		h.s.discovery.add(n)
	}
	out.Known = h.s.discovery.list()
	return connect.NewResponse(out), nil
}

// membershipLoop runs the steps above until the server closes.
func (s *Server) membershipLoop() {
	lost := make(chan struct{})
	go func() {
		defer close(lost)
		s.exitOnFailedLog()
	}()
	defer func() { <-lost }()
	s.discovery.add(s.selfInfo())
	m := membership{s: s}
	pause := 100 * time.Millisecond
	for !s.node.Formed() {
		if err := m.formOrJoin(); err != nil {
			m.report(err)
		}
		select {
		case <-s.stopC:
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
	}
	check := time.NewTicker(time.Second)
	defer check.Stop()
	for {
		if err := m.keep(); err != nil {
			s.log.Info("membership not up to date yet", "err", err)
		}
		select {
		case <-s.stopC:
			return
		case <-check.C:
		}
	}
}

// membership is the membership loop's state.
type membership struct {
	s *Server
	// caughtUpAt is the leader's commit index when this node joined: a
	// non-voter asks for a vote once it has applied this far.
	caughtUpAt uint64
	// tooMany is logged once: more nodes answered than expected.
	tooMany bool
	// refusal is the last error logged for a node of another engine,
	// so that the same one is not logged again at every retry.
	refusal string
}

// report logs why this node is not a member yet: as an error when a node
// it was told to meet runs another consensus engine, which no retry can
// change (the operator must), and as a wait otherwise. The node keeps
// trying, unready, since another cluster may yet answer at those addresses.
func (m *membership) report(err error) {
	if !errors.Is(err, raftnode.ErrOtherEngine) {
		m.s.log.Info("not a cluster member yet", "err", err)
		return
	}
	if msg := err.Error(); msg != m.refusal {
		m.refusal = msg
		m.s.log.Error("not joining: a node it was told to join runs another consensus engine; this node stays unready", "err", err)
	}
}

// checkEngine asks the node at addr which consensus engine it runs,
// before this node asks to join it or introduces itself: a node of an
// older build would add this one whatever its engine, and says none,
// which is hashicorp/raft.
func (m *membership) checkEngine(ctx context.Context, addr string) error {
	s := m.s
	res, err := s.peers.to(addr).cluster.Status(ctx, connect.NewRequest(&tenurev1.StatusRequest{}))
	if err != nil {
		return err
	}
	if e := engineOf(res.Msg.GetEngine()); e != s.node.Engine() {
		return otherEngine(s.node.ID(), s.node.Engine(), fmt.Sprintf("node %s at %s", res.Msg.GetId(), addr), e)
	}
	return nil
}

// sameEngine reports whether n, as another node described it, runs this
// node's engine.
func (m *membership) sameEngine(n *tenurev1.NodeInfo) bool {
	return engineOf(n.GetEngine()) == m.s.node.Engine()
}

// callTimeout bounds each call the membership loop makes to another node.
const callTimeout = 2 * time.Second

func (m *membership) formOrJoin() error {
	s := m.s
	if s.cfg.BootstrapExpect <= 1 {
		return m.joinAny()
	}
	var refused []error
	for _, addr := range s.cfg.Join {
		if addr == s.advertise {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := m.checkEngine(ctx, addr)
		var res *connect.Response[tenurev1.IntroduceResponse]
		if err == nil {
			res, err = s.peers.to(addr).cluster.Introduce(ctx, connect.NewRequest(&tenurev1.IntroduceRequest{
				Node: s.selfInfo(), Expect: int32(s.cfg.BootstrapExpect),
			}))
		}
		cancel()
		if errors.Is(err, raftnode.ErrOtherEngine) {
			refused = append(refused, err)
			continue
		}
		if err != nil {
			s.log.Debug("introduction failed", "to", addr, "err", err)
			continue
		}
		if res.Msg.GetFormed() {
			// A cluster exists already (this node's data was lost, or it
			// started late): join it rather than form another.
			return m.joinAny()
		}
		// An older build does not check engines: whom it met may run
		// the other one.
		for _, n := range append(res.Msg.GetKnown(), res.Msg.GetNode()) {
			if m.sameEngine(n) {
				s.discovery.add(n)
			}
		}
	}
	known := s.discovery.list()
	switch {
	case len(known) < s.cfg.BootstrapExpect:
		return errors.Join(append([]error{fmt.Errorf("met %d of the %d nodes expected (--bootstrap-expect)", len(known), s.cfg.BootstrapExpect)}, refused...)...)
	case len(known) > s.cfg.BootstrapExpect:
		if !m.tooMany {
			s.log.Error("met more nodes than --bootstrap-expect; not forming a cluster whose members could disagree on who is in it", "expect", s.cfg.BootstrapExpect, "met", len(known))
			m.tooMany = true
		}
		return errors.New("too many nodes for --bootstrap-expect")
	}
	voters := make([]raftnode.Peer, len(known))
	for i, n := range known {
		voters[i] = raftnode.Peer{ID: n.GetId(), Address: n.GetPeerAddress()}
	}
	err := s.node.BootstrapCluster(voters)
	if errors.Is(err, raftnode.ErrAlreadyFormed) {
		return nil
	}
	if err == nil {
		s.log.Info("cluster formed", "voters", len(voters))
	}
	return err
}

// joinAny asks each --join address in turn to add this node.
func (m *membership) joinAny() error {
	s := m.s
	var errs []error
	for _, addr := range s.cfg.Join {
		if addr == s.advertise {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := m.checkEngine(ctx, addr)
		var res *connect.Response[tenurev1.JoinResponse]
		if err == nil {
			res, err = s.peers.to(addr).cluster.Join(ctx, connect.NewRequest(m.joinRequest(false)))
		}
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.caughtUpAt = res.Msg.GetCommitIndex()
		s.log.Info("joined the cluster as a non-voter", "via", addr, "catch_up_to", m.caughtUpAt)
		return nil
	}
	return errors.Join(errs...)
}

func (m *membership) joinRequest(voter bool) *tenurev1.JoinRequest {
	return &tenurev1.JoinRequest{Id: m.s.node.ID(), PeerAddress: m.s.node.Addr(), ApiAddress: m.s.advertise, Voter: voter, Version: statemachine.Version, EtcdAddress: m.s.etcdAdvertise, Engine: m.s.node.Engine()}
}

// keep registers this node's API address and asks for its vote, through
// the leader, when either is missing.
func (m *membership) keep() error {
	s := m.s
	members, err := s.node.Members()
	if err != nil {
		return err
	}
	i := slices.IndexFunc(members, func(mem raftnode.Member) bool { return mem.ID == s.node.ID() })
	if i < 0 {
		return nil // not added yet, or removed: nothing to keep
	}
	self := members[i]
	var registered, registeredEtcd string
	var version int
	_ = s.node.ReadLocal(func(st *statemachine.Machine) error {
		registered, _ = st.MemberAddress(self.ID)
		registeredEtcd, _ = st.MemberEtcdAddress(self.ID)
		version = st.MemberVersion(self.ID)
		return nil
	})
	if s.leading.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := s.raiseClusterVersion(ctx)
		cancel()
		if err != nil {
			s.log.Info("cluster version not raised yet", "err", err)
		}
	}
	switch {
	case registered != s.advertise || registeredEtcd != s.etcdAdvertise || version != statemachine.Version || self.Address != s.node.Addr():
		res, err := m.join(false)
		if err == nil && m.caughtUpAt == 0 {
			m.caughtUpAt = res.GetCommitIndex()
		}
		return err
	case !self.Voter && self.Held:
		// An operator added it as a learner, to promote it when they
		// choose (etcdctl member promote).
	case !self.Voter:
		if m.caughtUpAt == 0 {
			res, err := m.join(false)
			if err != nil {
				return err
			}
			m.caughtUpAt = res.GetCommitIndex()
		}
		if s.node.AppliedIndex() < m.caughtUpAt {
			return nil // still catching up
		}
		if _, err := m.join(true); err != nil {
			return err
		}
		s.log.Info("promoted to voter", "applied", s.node.AppliedIndex())
	}
	return nil
}

// join calls Join on the leader: here when this node leads.
func (m *membership) join(voter bool) (*tenurev1.JoinResponse, error) {
	s := m.s
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	req := m.joinRequest(voter)
	if s.leading.Load() {
		if err := s.join(ctx, req); err != nil {
			return nil, err
		}
		return &tenurev1.JoinResponse{CommitIndex: s.node.Status().CommitIndex}, nil
	}
	addr, ok := s.leaderAddress()
	if !ok || addr == s.advertise {
		// A member back on a new peer address (a pod's new IP) hears
		// from no leader — the leader sends to the old address — and
		// its votes are refused while the others have one. Any member
		// it was told to join forwards the request to the leader, which
		// then sends to the new address.
		return m.joinThrough(ctx, req)
	}
	res, err := s.peers.to(addr).cluster.Join(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// joinThrough asks each --join address in turn to pass req to the leader.
func (m *membership) joinThrough(ctx context.Context, req *tenurev1.JoinRequest) (*tenurev1.JoinResponse, error) {
	s := m.s
	errs := []error{errors.New("no leader to ask yet")}
	for _, addr := range s.cfg.Join {
		if addr == s.advertise {
			continue
		}
		res, err := s.peers.to(addr).cluster.Join(ctx, connect.NewRequest(req))
		if err == nil {
			return res.Msg, nil
		}
		errs = append(errs, fmt.Errorf("through %s: %w", addr, err))
	}
	return nil, errors.Join(errs...)
}

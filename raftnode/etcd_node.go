package raftnode

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Engines for Config.Engine.
const (
	EngineHashicorp = "hashicorp"
	EngineEtcd      = "etcd"
)

// openEtcdNode is Open for the etcd engine: the same stores, metrics and
// state machine as the hashicorp engine, with etcdEngine in place of
// hashicorp/raft.
func openEtcdNode(cfg Config, newState func() state) (n *Node, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "raft", "node", cfg.NodeID)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("raftnode: register metrics: %w", err)
	}
	var undo []func() error
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			m.unregister()
		}
	}()
	converting := false
	if cfg.Stores.given() == 0 {
		if converting, err = claimDir(filepath.Join(cfg.DataDir, "raft")); err != nil {
			return nil, err
		}
	}
	st, err := openStores(cfg, m, log)
	if err != nil {
		return nil, err
	}
	undo = append(undo, st.close)
	var trans peerTransport
	if cfg.Network != nil {
		trans = cfg.Network.Transport(cfg.NodeID)
	} else {
		t, err := listenPeers(peerConfig{ID: raftID(cfg.NodeID), Bind: cfg.PeerAddr, Advertise: cfg.Advertise, TLS: cfg.PeerTLS, ClusterTag: engineEtcd, Logger: log, Metrics: m.peers})
		if err != nil {
			return nil, fmt.Errorf("raftnode: transport: %w", err)
		}
		trans = t
	}
	undo = append(undo, trans.Close)
	self := memberInfo{ID: cfg.NodeID, Addr: trans.LocalAddr()}
	if err := prepareEtcd(cfg, st, self, newState, converting, m, log); err != nil {
		return nil, err
	}
	f := &fsm{
		st:        newState(),
		newState:  newState,
		observer:  cfg.Observer,
		onRestore: cfg.OnRestore,
		log:       log,
		metrics:   m,
	}
	n = &Node{
		id:             cfg.NodeID,
		fsm:            f,
		closeTransport: trans.Close,
		closeStores:    st.close,
		space:          st.space,
		metrics:        m,
		log:            log,
		election:       2 * cmp.Or(cfg.ElectionTimeout, defaultElectionTimeout),
		peerTLS:        cfg.PeerTLS,
		leaderCh:       make(chan bool, 1),
		shutdownCh:     make(chan struct{}),
	}
	if n.etcd, err = openEtcd(n, cfg, st, trans); err != nil {
		return nil, err
	}
	if st.dir != "" {
		n.wg.Add(1)
		go n.watchSpace(cfg.DiskCheckInterval)
	}
	log.Info("raft node open", "engine", engineEtcd, "addr", trans.LocalAddr(), "dir", st.dir)
	return n, nil
}

// defaultElectionTimeout is the etcd engine's election timeout when
// Config.ElectionTimeout is zero; raft picks each node's timeout at
// random between it and twice it, so a failover is bounded by twice it.
const defaultElectionTimeout = time.Second

// claimDir makes sure dir holds the etcd engine's state, none, or the
// hashicorp engine's (converting: Open converts it), and marks a new one
// as the etcd engine's before anything is written in it.
func claimDir(dir string) (converting bool, err error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return false, fmt.Errorf("raftnode: %w", err)
	}
	engine, err := readEngine(dir)
	switch {
	case err != nil:
		return false, err
	case engine == "":
		return false, writeEngine(dir, engineEtcd)
	case engine == engineEtcd:
		return false, nil
	case engine == engineHashicorp:
		return true, nil
	default:
		return false, fmt.Errorf("raftnode: %s holds state of an engine this build does not know, %q", dir, engine)
	}
}

func (n *Node) etcdMembership(ctx context.Context, op string, typ raftpb.ConfChangeType, id, addr string) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.etcd.changeMembership(ctx, op, typ, memberInfo{ID: id, Addr: addr})
}

// bootstrapCluster is BootstrapCluster for the etcd engine: it is run by
// the Ready loop, which swaps the waiting raft node for a bootstrapped one.
func (e *etcdEngine) bootstrapCluster(voters []Peer) error {
	peers, err := bootstrapPeers(Config{InitialVoters: voters}, e.self)
	if err != nil {
		return err
	}
	req := bootstrapRequest{peers: peers, done: make(chan error, 1)}
	select {
	case e.bootstrapCh <- req:
	case <-e.stop:
		return ErrClosed
	}
	return <-req.done
}

// Engine names the consensus engine this node runs: EngineHashicorp or
// EngineEtcd, what a joining node must run too.
func (n *Node) Engine() string {
	if n.etcd != nil {
		return EngineEtcd
	}
	return EngineHashicorp
}

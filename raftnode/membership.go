package raftnode

// Membership: the configuration (who votes, who learns, at which peer
// address) as a change proposes it, as apply applies it, and as a
// snapshot restores it; leadership transfer, which picks among the
// voters; and the Node calls that change them. Its state is its own type
// because a snapshot must copy it at the same applied index as the
// state, and the transport must be told of every change as it applies.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Formed reports whether this node belongs to a cluster yet: a node
// started without Bootstrap has no configuration until a leader adds it
// or BootstrapCluster forms one.
func (n *Node) Formed() bool {
	members, err := n.Members()
	return err == nil && len(members) > 0
}

// BootstrapCluster forms a cluster of the given voters on a node that has
// no state yet, as Config.InitialVoters does at Open, for nodes that
// learn their peers only after they start (--bootstrap-expect). Every
// voter must bootstrap with the same list; a node that already has state,
// its own or a leader's, returns ErrAlreadyFormed.
func (n *Node) BootstrapCluster(voters []Peer) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.engine.bootstrapCluster(voters)
}

// ErrAlreadyFormed is returned by BootstrapCluster on a node that already
// belongs to a cluster.
var ErrAlreadyFormed = errors.New("raftnode: this node already has cluster state")

// AddNonvoter adds a node that receives the log but does not vote (a
// raft learner), or updates its address. A joining node starts so, and
// is promoted with AddVoter once it has caught up, so that a slow
// newcomer never counts towards a quorum it cannot yet help make. It must
// be called on the leader.
func (n *Node) AddNonvoter(ctx context.Context, id, addr string) error {
	return n.AddLearner(ctx, id, addr, false)
}

// AddLearner is AddNonvoter for a learner that is held (held set): one
// an operator added to promote later, as etcd's `member add --learner`
// does, which does not ask for its vote itself (Member.Held). Changing
// only held changes the configuration too.
func (n *Node) AddLearner(ctx context.Context, id, addr string, held bool) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.engine.changeMembership(ctx, "add non-voter", raftpb.ConfChangeAddLearnerNode, memberInfo{ID: id, Addr: addr, Held: held})
}

// Progress is how far the log of member id has been replicated (its
// match index) and the leader's own last index, as the leader knows
// them: whether a learner is in sync. It must be called on the leader.
func (n *Node) Progress(id string) (match, leaderMatch uint64, err error) {
	if err := n.enter(); err != nil {
		return 0, 0, err
	}
	defer n.inflight.Done()
	e := n.engine
	if !e.isLeader() {
		return 0, 0, n.notLeader()
	}
	st := e.raft().Status()
	pr, ok := st.Progress[raftID(id)]
	if !ok {
		return 0, 0, fmt.Errorf("raftnode: progress: %w: %s", ErrUnknownMember, id)
	}
	return pr.Match, st.Progress[e.rid].Match, nil
}

// TransferLeadership hands leadership to voter id, or to the most
// up-to-date voter when id is empty, and returns once another node leads
// or an election's time has passed. It must be called on the leader.
// Proposals made during the transfer are refused with a *NotLeaderError,
// so they are never in doubt.
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.engine.transferLeadership(ctx, id)
}

// ErrUnknownMember is returned for a server ID the configuration does not
// list.
var ErrUnknownMember = errors.New("no such member")

// AddVoter adds a node to the cluster as a voter, promotes a non-voter,
// or updates a voter's address. It must be called on the leader.
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	return n.changeMembership(ctx, "add voter", raftpb.ConfChangeAddNode, id, addr)
}

// RemoveServer removes a node from the cluster. It must be called on the
// leader.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	return n.changeMembership(ctx, "remove server", raftpb.ConfChangeRemoveNode, id, "")
}

func (n *Node) changeMembership(ctx context.Context, op string, typ raftpb.ConfChangeType, id, addr string) error {
	if err := n.enter(); err != nil {
		return err
	}
	defer n.inflight.Done()
	return n.engine.changeMembership(ctx, op, typ, memberInfo{ID: id, Addr: addr})
}

// Member is one server in the raft configuration.
type Member struct {
	ID      string
	Address string // raft peer address
	Voter   bool
	Leader  bool
	// Held is set on a learner that waits to be promoted (AddLearner).
	Held bool
}

// Members lists the servers in the latest applied configuration, with
// which of them leads as far as this node knows.
func (n *Node) Members() ([]Member, error) {
	if err := n.enter(); err != nil {
		return nil, err
	}
	defer n.inflight.Done()
	return n.engine.membersList(), nil
}

// membership is the configuration as this node has applied it: raft's
// ConfState (who votes, who learns) and, for each member, the node ID its
// raft ID hashes and its peer address, which raft does not keep. Apply
// changes it in log order; proposers, the transport's handler and status
// read it. It lives apart from the engine's other state because the
// snapshot must copy it at the same applied index as the state.
type membership struct {
	// changing serialises proposed changes: raft refuses a second while
	// one is unapplied.
	changing sync.Mutex
	mu       sync.RWMutex // guards byID and conf
	byID     map[uint64]memberInfo
	conf     raftpb.ConfState
}

// copy returns the configuration, for a snapshot; the caller holds mu.
func (m *membership) copyLocked() (raftpb.ConfState, map[uint64]memberInfo) {
	members := make(map[uint64]memberInfo, len(m.byID))
	for id, mi := range m.byID {
		members[id] = mi
	}
	return m.conf, members
}

// applyConfChange applies a membership entry to raft and to the members
// this engine knows, and reports the request it answers.
func (e *engine) applyConfChange(ent raftpb.Entry) (req uint64, mine bool) {
	var cc raftpb.ConfChangeV2
	if ent.Type == raftpb.EntryConfChange {
		var v1 raftpb.ConfChange
		if err := v1.Unmarshal(ent.Data); err != nil {
			panic(fmt.Sprintf("raftnode: configuration entry %d: %v", ent.Index, err))
		}
		cc = v1.AsV2()
	} else if err := cc.Unmarshal(ent.Data); err != nil {
		panic(fmt.Sprintf("raftnode: configuration entry %d: %v", ent.Index, err))
	}
	var ctx confContext
	if len(cc.Context) > 0 {
		if err := json.Unmarshal(cc.Context, &ctx); err != nil {
			e.n.log.Error("raft: configuration entry with an unreadable context", "index", ent.Index, "error", err)
		}
	}
	cs := e.raft().ApplyConfChange(cc)
	e.members.mu.Lock()
	for _, ch := range cc.Changes {
		switch ch.Type {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			if ctx.ID != "" {
				e.members.byID[ch.NodeID] = ctx.memberInfo
			}
			if m, ok := e.members.byID[ch.NodeID]; ok && ch.NodeID != e.rid {
				e.trans.SetPeer(ch.NodeID, m.Addr)
			}
		case raftpb.ConfChangeRemoveNode:
			delete(e.members.byID, ch.NodeID)
			if ch.NodeID != e.rid {
				e.trans.RemovePeer(ch.NodeID)
			}
		}
	}
	if cs != nil {
		e.members.conf = *cs
		e.soleVoter.Store(soleVoter(*cs, e.rid))
		defer e.recordMembers(*cs)
	}
	e.members.mu.Unlock()
	return ctx.Req, ctx.From == e.rid && ctx.Req != 0
}

// setMembership replaces the members, from a snapshot.
func (e *engine) setMembership(cs raftpb.ConfState, members map[uint64]memberInfo) {
	e.members.mu.Lock()
	defer e.members.mu.Unlock()
	for id := range e.members.byID {
		if _, ok := members[id]; !ok && id != e.rid {
			e.trans.RemovePeer(id)
		}
	}
	e.members.byID = members
	e.members.conf = cs
	e.soleVoter.Store(soleVoter(cs, e.rid))
	defer e.recordMembers(cs)
	for id, m := range members {
		if id != e.rid {
			e.trans.SetPeer(id, m.Addr)
		}
	}
}

// namesEveryMember reports whether cs lists every node of the applied
// configuration.
func (e *engine) namesEveryMember(cs raftpb.ConfState) bool {
	e.members.mu.RLock()
	defer e.members.mu.RUnlock()
	return NamesEveryMember(cs, e.members.conf)
}

// NamesEveryMember reports whether a snapshot's configuration snap names
// every voter and learner of the configuration now: one that does not is
// refused by a member added since, so raftStorage withholds it and a
// fresh one is taken. Pure, for internal/sim.
func NamesEveryMember(snap, now raftpb.ConfState) bool {
	for _, ids := range [][]uint64{now.Voters, now.Learners} {
		for _, id := range ids {
			if !slices.Contains(snap.Voters, id) && !slices.Contains(snap.Learners, id) {
				return false
			}
		}
	}
	return true
}

// changeMembership proposes one configuration change and waits until it
// is applied here.
func (e *engine) changeMembership(ctx context.Context, op string, typ raftpb.ConfChangeType, m memberInfo) error {
	e.members.changing.Lock()
	defer e.members.changing.Unlock()
	if !e.isLeader() {
		return e.n.notLeader()
	}
	id := raftID(m.ID)
	e.members.mu.RLock()
	known, exists := e.members.byID[id]
	voter, learner := slices.Contains(e.members.conf.Voters, id), slices.Contains(e.members.conf.Learners, id)
	e.members.mu.RUnlock()
	if exists && known.ID != m.ID {
		return fmt.Errorf("raftnode: %s: node IDs %s and %s hash to the same raft ID: rename one", op, known.ID, m.ID)
	}
	switch typ {
	case raftpb.ConfChangeAddNode:
		if voter && known.Addr == m.Addr {
			return nil
		}
	case raftpb.ConfChangeAddLearnerNode:
		if learner && known == m {
			return nil
		}
		if voter {
			// Raft only demotes through a joint configuration; today's
			// engine never asked for that either.
			return fmt.Errorf("raftnode: %s: %s is a voter", op, m.ID)
		}
	case raftpb.ConfChangeRemoveNode:
		if !voter && !learner {
			return nil
		}
	}
	ctx, cancel := membershipContext(ctx)
	defer cancel()
	req, w := e.proposals.register(e.term.Load())
	cc, _ := json.Marshal(confContext{memberInfo: m, Req: req, From: e.rid})
	change := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: typ, NodeID: id}}, Context: cc}
	if err := e.raft().ProposeConfChange(ctx, change); err != nil {
		e.proposals.forget(req)
		return e.proposeError(op, err)
	}
	_, err := e.await(ctx, op, req, w)
	return err
}

// membershipContext bounds a change without a deadline: raft turns a
// change it refuses (one already pending) into an empty entry, which
// answers nobody.
func membershipContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultApplyTimeout)
}

// transferLeadership hands leadership to id, or to the voter whose log is
// furthest along, and waits until another node leads or the election
// timeout passes.
func (e *engine) transferLeadership(ctx context.Context, id string) error {
	if !e.isLeader() {
		return e.n.notLeader()
	}
	st := e.raft().Status()
	var target uint64
	if id != "" {
		target = raftID(id)
		e.members.mu.RLock()
		_, known := e.members.byID[target]
		voter := slices.Contains(e.members.conf.Voters, target)
		e.members.mu.RUnlock()
		switch {
		case !known:
			return fmt.Errorf("raftnode: transfer leadership: %w: %s", ErrUnknownMember, id)
		case !voter:
			return fmt.Errorf("raftnode: transfer leadership: %s does not vote, so it cannot lead", id)
		}
	} else {
		var best uint64
		for pid, pr := range st.Progress {
			if pid != e.rid && !pr.IsLearner && (target == 0 || pr.Match > best) {
				target, best = pid, pr.Match
			}
		}
		if target == 0 {
			return errors.New("raftnode: transfer leadership: no other voter")
		}
	}
	if target == e.rid {
		return nil
	}
	e.lease.Void(time.Now())
	e.raft().TransferLeadership(ctx, e.rid, target)
	deadline := time.NewTimer(2 * e.n.election)
	defer deadline.Stop()
	tick := time.NewTicker(e.tick)
	defer tick.Stop()
	for {
		if l := e.leader.Load(); l != e.rid && l != 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return fmt.Errorf("raftnode: transfer leadership: %s did not take over within %v", e.memberName(target), 2*e.n.election)
		case <-ctx.Done():
			return fmt.Errorf("raftnode: transfer leadership: %w", ctx.Err())
		case <-e.stop:
			return ErrClosed
		}
	}
}

func (e *engine) memberName(id uint64) string {
	e.members.mu.RLock()
	defer e.members.mu.RUnlock()
	if m, ok := e.members.byID[id]; ok {
		return m.ID
	}
	return strconv.FormatUint(id, 16)
}

// leaderInfo is the leader's peer address and node ID, empty when no
// leader is known.
func (e *engine) leaderInfo() (addr, id string) {
	l := e.leader.Load()
	if l == 0 {
		return "", ""
	}
	e.members.mu.RLock()
	defer e.members.mu.RUnlock()
	if l == e.rid {
		return e.self.Addr, e.self.ID
	}
	m := e.members.byID[l]
	return m.Addr, m.ID
}

func (e *engine) membersList() []Member {
	_, leader := e.leaderInfo()
	e.members.mu.RLock()
	defer e.members.mu.RUnlock()
	var out []Member
	add := func(ids []uint64, voter bool) {
		for _, id := range ids {
			m := e.members.byID[id]
			if id == e.rid {
				m = memberInfo{ID: e.self.ID, Addr: cmp.Or(m.Addr, e.self.Addr)}
			}
			out = append(out, Member{ID: m.ID, Address: m.Addr, Voter: voter, Leader: m.ID == leader && leader != "", Held: !voter && e.members.byID[id].Held})
		}
	}
	add(e.members.conf.Voters, true)
	add(e.members.conf.Learners, false)
	return out
}

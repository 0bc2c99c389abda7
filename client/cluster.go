package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// Member is a server of the cluster: where it is and whether it votes,
// as the node that answered Members sees the raft configuration, and
// the status the member reported about itself (embedded), unless it
// could not be asked: then Err says why and the status is zero.
type Member struct {
	ID          string
	APIAddress  string // "" until the member has registered it
	PeerAddress string
	Voter       bool
	Leader      bool // the answering node's view of who leads
	Self        bool // the node that answered
	MemberStatus
	Err string // why the member's status is unknown, "" when it answered
}

// Reachable reports whether the member answered with its status.
func (m Member) Reachable() bool { return m.Err == "" }

// MemberStatus is what a node reports about itself.
type MemberStatus struct {
	Role             string // "leader", "follower", "candidate" or "shutdown"
	LeaderID         string // the leader it follows, "" during an election
	LeaderAPIAddress string
	Term             uint64
	CommitIndex      uint64
	AppliedIndex     uint64
	LastLogIndex     uint64
	// LastContact is how long ago this follower last heard from the
	// leader; 0 on the leader.
	LastContact time.Duration
	Revision    int64 // of its store, as applied so far
	// Ready: a member of a cluster with a leader, and ready to serve if
	// it leads.
	Ready bool
	// Version is the highest cluster version the member's build runs;
	// ClusterVersion the one the cluster runs, as the member applied it.
	// A rolling upgrade is done when every member's Version is the
	// ClusterVersion.
	Version, ClusterVersion int
}

func memberStatusFrom(st *tenurev1.StatusResponse) MemberStatus {
	return MemberStatus{
		Role: st.GetRole(), LeaderID: st.GetLeaderId(), LeaderAPIAddress: st.GetLeaderApiAddress(),
		Term: st.GetTerm(), CommitIndex: st.GetCommitIndex(), AppliedIndex: st.GetAppliedIndex(),
		LastLogIndex: st.GetLastLogIndex(), LastContact: st.GetLastContact().AsDuration(),
		Revision: st.GetRevision(), Ready: st.GetReady(),
		Version: int(st.GetVersion()), ClusterVersion: int(st.GetClusterVersion()),
	}
}

// Members lists the cluster's servers in the order of the raft
// configuration, as the endpoint in use sees them, each with the status
// it reports about itself. Members that do not answer in about a second
// are listed with Err set: Members fails only if the endpoint itself
// cannot answer.
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	var out []Member
	err := c.do(ctx, "Members", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.cluster.Members(ctx, connect.NewRequest(&tenurev1.MembersRequest{}))
		if err != nil {
			return err
		}
		out = out[:0]
		for _, m := range resp.Msg.GetMembers() {
			mem := Member{
				ID: m.GetId(), APIAddress: m.GetApiAddress(), PeerAddress: m.GetPeerAddress(),
				Voter: m.GetVoter(), Leader: m.GetLeader(), Self: m.GetSelf(), Err: m.GetError(),
			}
			if st := m.GetStatus(); st != nil {
				mem.MemberStatus = memberStatusFrom(st)
			} else if mem.Err == "" {
				mem.Err = "no status reported"
			}
			out = append(out, mem)
		}
		return nil
	})
	return out, err
}

// RemoveMember takes the member id out of the cluster's configuration,
// through the leader. It returns ErrNotFound when id is not a member. A
// removed node stops taking part at once; stop its process, and give it
// a new data dir before it joins again. The call is not repeated once
// sent: after ErrUnknownOutcome, list the members to see.
func (c *Client) RemoveMember(ctx context.Context, id string) error {
	return c.do(ctx, "RemoveMember", once, func(ctx context.Context, ep *endpoint) error {
		_, err := ep.cluster.RemoveMember(ctx, connect.NewRequest(&tenurev1.RemoveMemberRequest{Id: id}))
		return err
	})
}

// TransferLeadership hands leadership to the voter id, or to the most
// up-to-date other voter when id is "", and returns the ID of the leader
// once the transfer is done. Naming the current leader changes nothing.
// It returns ErrNotFound when id is not a member. The call is not
// repeated once sent — a second transfer would move leadership again —
// so after ErrUnknownOutcome, list the members to see who leads.
func (c *Client) TransferLeadership(ctx context.Context, id string) (leader string, err error) {
	err = c.do(ctx, "TransferLeadership", once, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.cluster.TransferLeadership(ctx, connect.NewRequest(&tenurev1.TransferLeadershipRequest{Id: id}))
		if err == nil {
			leader = resp.Msg.GetLeaderId()
		}
		return err
	})
	return leader, err
}

// Snapshot writes a consistent copy of the cluster's whole state to w —
// the file `tenure snapshot save` writes and `tenure snapshot restore`
// reads — and returns the store revision it was taken at. The leader
// takes it after a linearizable read; a follower asked for it names the
// leader and the call goes there. Being a read, it is retried across a
// change of leader or a cut connection: the copy is received whole and
// its SHA-256 checked before anything is written to w, so w never gets
// a partial or mixed copy from a failed attempt. It fails with
// ErrChecksumMismatch if what arrived is not what the leader sent. The
// request timeout (WithRequestTimeout) bounds each attempt.
func (c *Client) Snapshot(ctx context.Context, w io.Writer) (revision int64, err error) {
	var buf bytes.Buffer
	err = c.do(ctx, "Snapshot", idempotent, func(ctx context.Context, ep *endpoint) error {
		buf.Reset()
		var err error
		revision, err = receiveSnapshot(ctx, ep, &buf)
		return err
	})
	if err != nil {
		return 0, err
	}
	if _, err := buf.WriteTo(w); err != nil {
		return 0, &Error{Op: "Snapshot", Cause: fmt.Errorf("write the snapshot: %w", err)}
	}
	return revision, nil
}

// receiveSnapshot reads one Snapshot stream into buf and checks it.
func receiveSnapshot(ctx context.Context, ep *endpoint, buf *bytes.Buffer) (int64, error) {
	stream, err := ep.cluster.Snapshot(ctx, connect.NewRequest(&tenurev1.SnapshotRequest{}))
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	h := sha256.New()
	var revision int64
	var want string
	for stream.Receive() {
		chunk := stream.Msg()
		if want != "" {
			return 0, connect.NewError(connect.CodeDataLoss, errors.New("snapshot: a chunk arrived after the last one"))
		}
		buf.Write(chunk.GetData())
		h.Write(chunk.GetData())
		revision, want = chunk.GetRevision(), chunk.GetSha256()
	}
	if err := stream.Err(); err != nil {
		return 0, err
	}
	if want == "" {
		// Cut short without an error: worth another try, like a cut
		// connection.
		return 0, connect.NewError(connect.CodeUnavailable, fmt.Errorf("snapshot: the stream ended after %d bytes, before its last chunk", buf.Len()))
	}
	// DataLoss is not retried: the leader would most likely send the
	// same bytes again.
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return 0, &Error{Op: "Snapshot", Kind: ErrChecksumMismatch, Cause: connect.NewError(connect.CodeDataLoss,
			fmt.Errorf("snapshot at revision %d: sha256 of the %d bytes received is %s, the leader sent %s", revision, buf.Len(), got, want))}
	}
	return revision, nil
}

package etcdapi

import (
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/tenurehq/tenure/frontend"
)

// ErrNotLeader is what a Backend returns (possibly wrapped) for a call
// that needs the leader on a node that is not it.
var ErrNotLeader = frontend.ErrNotLeader

// Backend is the node the services run on: the node every API sees
// (frontend.Node), which applies every rule of who may do what, and
// what only etcd's services ask of it.
type Backend interface {
	frontend.Node
	// Identity is the session identity an etcd lease granted by the
	// caller of ctx takes: its principal, or "etcd" without a policy.
	Identity(ctx context.Context) string
	// SessionTTL bounds a new lease's TTL: below min it is raised to
	// min, as etcd raises it to its minimum; above max it is refused.
	SessionTTL() (minTTL, maxTTL time.Duration)
	// Node describes this node and the cluster for Status and
	// MemberList.
	Node(ctx context.Context) (NodeInfo, error)
	// Ident is what every response header carries: the cluster's ID,
	// this member's ID and the raft term it knows. Cheap: no I/O.
	Ident() (clusterID, memberID, raftTerm uint64)
	// Authenticate checks an etcd user's name and password against the
	// policy and returns a token for the "token" metadata of later
	// calls; rpctypes.ErrGRPCAuthFailed when they do not match, and
	// rpctypes.ErrGRPCAuthNotEnabled without a policy.
	Authenticate(ctx context.Context, name, password string) (string, error)
	// AuthEnabled reports whether a policy is in force: a policy file,
	// or etcd's users and roles once enabled.
	AuthEnabled() bool
	// PolicyFileNames reports whether the policy file defines principal
	// name, which etcd's store then may not add as a user.
	PolicyFileNames(name string) bool
	// BcryptCost is the cost of the password hashes the store keeps, as
	// etcd's --bcrypt-cost.
	BcryptCost() int
	// Alarms lists the alarms raised through the log, as etcd's alarm
	// store holds them: a member's NOSPACE once it held its storage
	// quota. A full disk's NOSPACE is NodeInfo.NoSpace, not among them.
	Alarms(ctx context.Context) ([]*pb.AlarmMember, error)
	// Disarm clears member's alarm through the log, as etcd's Alarm
	// DEACTIVATE does; an error when that alarm is not raised.
	Disarm(ctx context.Context, member uint64, alarm pb.AlarmType) error
	// Arm raises member's alarm through the log, as etcd's Alarm
	// ACTIVATE does: every member then obeys it until Disarm.
	// ErrMemberNotFound when no member has that ID.
	Arm(ctx context.Context, member uint64, alarm pb.AlarmType) error
	// MoveLeader hands leadership to voting member target and returns
	// once it leads, on the leader (a follower forwards the call).
	// ErrBadLeaderTransferee when target is no voter of the cluster.
	MoveLeader(ctx context.Context, target uint64) error
	// Members changes the cluster's membership, on the leader:
	// docs/etcd.md, Membership, says how etcd's calls map onto it.
	Members() Membership
	// MaxResponseBytes caps the keys and values one answer may carry
	// (0: DefaultMaxResponseBytes). The KV service asks once, when it
	// is registered.
	MaxResponseBytes() int
}

// Verb is what a caller does to keys.
type Verb = frontend.Verb

const (
	VerbRead  = frontend.VerbRead
	VerbWrite = frontend.VerbWrite
)

// NodeInfo is what Status and MemberList report.
type NodeInfo struct {
	ClusterID uint64
	MemberID  uint64
	Name      string
	LeaderID  uint64 // 0: no leader known
	RaftTerm  uint64
	RaftIndex uint64 // last log index
	Applied   uint64
	DBSize    int64 // bytes the data directory's log and snapshots hold, not the log's preallocated room
	Version   string
	// NoSpace is set while the node refuses writes for a full disk:
	// Alarm reports NOSPACE for it.
	NoSpace string
	Members []Member
	// Learner is set when this node is a non-voter.
	Learner bool
}

// Member is one member of the cluster, as MemberList shows it.
type Member struct {
	ID         uint64
	Name       string
	PeerURLs   []string
	ClientURLs []string // the member's etcd API address, when it serves one
	IsLearner  bool
}

// Membership is what the Cluster service changes: the raft
// configuration, through the leader. Each call answers once the change
// is applied.
type Membership interface {
	// Add adds a member that will listen for raft at peerURLs' one
	// address, without a vote when learner is set, and returns it.
	// ErrBadMemberURLs for an address that is no host:port;
	// ErrPeerURLExist when a member has it already.
	Add(ctx context.Context, peerURLs []string, learner bool) (Member, error)
	// Remove removes member id: ErrMemberNotFound if there is none.
	Remove(ctx context.Context, id uint64) error
	// Update gives member id a new peer address, keeping its vote or
	// its want of one.
	Update(ctx context.Context, id uint64, peerURLs []string) error
	// Promote makes learner id a voter: ErrMemberNotLearner when it
	// votes already, ErrLearnerNotReady while its log is behind.
	Promote(ctx context.Context, id uint64) error
}

// What Backend's membership and leadership calls return (possibly
// wrapped), each answered with etcd's code and text for it.
var (
	// ErrMemberNotFound: no member has the ID given.
	ErrMemberNotFound = errors.New("member not found")
	// ErrMemberNotLearner: a promotion of a member that votes already.
	ErrMemberNotLearner = errors.New("can only promote a learner member")
	// ErrLearnerNotReady: a promotion of a learner whose log is too far
	// behind the leader's to vote safely.
	ErrLearnerNotReady = errors.New("can only promote a learner member which is in sync with leader")
	// ErrPeerURLExist: a new member's or a new peer address that a
	// member has already.
	ErrPeerURLExist = errors.New("peer URLs already exists")
	// ErrBadMemberURLs: peer URLs that do not name one host:port.
	ErrBadMemberURLs = errors.New("given member URLs are invalid")
	// ErrBadLeaderTransferee: leadership moved to a member that does
	// not vote, or to none.
	ErrBadLeaderTransferee = errors.New("bad leader transferee")
	// ErrLeaderTransferTimeout: the target of MoveLeader did not take
	// over in time.
	ErrLeaderTransferTimeout = errors.New("request timed out, leader transfer took too long")
	// ErrNotEnoughStarted: a change after which the voters that have
	// started would be fewer than a quorum (etcd's strict
	// reconfiguration check).
	ErrNotEnoughStarted = errors.New("re-configuration failed due to not enough started members")
)

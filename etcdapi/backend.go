package etcdapi

import (
	"context"
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
	// Alarms lists the alarms raised through the log, as etcd's alarm
	// store holds them: a member's NOSPACE once it held its storage
	// quota. A full disk's NOSPACE is NodeInfo.NoSpace, not among them.
	Alarms(ctx context.Context) ([]*pb.AlarmMember, error)
	// Disarm clears member's alarm through the log, as etcd's Alarm
	// DEACTIVATE does; an error when that alarm is not raised.
	Disarm(ctx context.Context, member uint64, alarm pb.AlarmType) error
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
	DBSize    int64 // bytes of the data directory's log and snapshots
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

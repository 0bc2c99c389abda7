package etcdapi

import (
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// ErrNotLeader is what a Backend returns (possibly wrapped) for a call
// that needs the leader on a node that is not it.
var ErrNotLeader = errors.New("not the leader")

// Backend is the node the services run on.
type Backend interface {
	// Propose applies cmd through the log on the leader, with the
	// caller of ctx as its Actor, and returns its result; the error is
	// the command's own (Result.Err) or the node's.
	Propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error)
	// Read runs fn on the state: a linearizable read on the leader, or
	// this node's state as it is when serializable. fn must not keep m.
	Read(ctx context.Context, serializable bool, fn func(m *statemachine.Machine) error) error
	// Sync brings this node's own state up to every write acknowledged
	// before the call, so that a serializable Read after it sees them
	// (a follower learns from the leader how far that is). It gives up,
	// leaving the state as it is, when no leader answers within a bound:
	// an etcd member cut off from its leader serves from its own state.
	Sync(ctx context.Context)
	// Renew renews session id on the leader, as a heartbeat does, and
	// returns its TTL; statemachine.ErrSessionNotFound when it is gone.
	Renew(ctx context.Context, id int64) (time.Duration, error)
	// Remaining is how long the leader lets session id live without a
	// renewal; statemachine.ErrSessionNotFound when it is gone.
	Remaining(ctx context.Context, id int64) (time.Duration, error)
	// Watch follows this node's published events from global revision
	// start on (0: from the next one), those filter accepts (nil: all),
	// as watch.Hub.Watch does. The caller closes it.
	Watch(start int64, filter func(*statemachine.Event) bool) (*watch.Watcher, error)
	// Authorize checks that the caller of ctx may do verb on the keys
	// in [key, end) (end "" is key alone, "\x00" every key from key on),
	// and returns rpctypes.ErrGRPCPermissionDenied (or an auth error)
	// when it may not. A Backend without a policy allows everything.
	Authorize(ctx context.Context, verb Verb, key, end string) error
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
	// AuthEnabled reports whether a policy is in force.
	AuthEnabled() bool
	// Done is closed when the node stops: streams end with it.
	Done() <-chan struct{}
	// Alarms lists the alarms raised through the log, as etcd's alarm
	// store holds them: a member's NOSPACE once it held its storage
	// quota. A full disk's NOSPACE is NodeInfo.NoSpace, not among them.
	Alarms(ctx context.Context) ([]*pb.AlarmMember, error)
	// Disarm clears member's alarm through the log, as etcd's Alarm
	// DEACTIVATE does; an error when that alarm is not raised.
	Disarm(ctx context.Context, member uint64, alarm pb.AlarmType) error
	// HoldWatch takes one of the caller's and the node's open-watch
	// slots for a watch, or refuses with an error naming the limit; the
	// watch calls release when it ends.
	HoldWatch(ctx context.Context) (release func(), err error)
}

// Verb is what a caller does to keys.
type Verb int

const (
	VerbRead Verb = iota + 1
	VerbWrite
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

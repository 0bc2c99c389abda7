package api

// ErrorHeader is the response header (Connect error metadata) in which the
// server names the domain error behind a failed call, so that a client
// maps it to a sentinel without parsing messages.
const ErrorHeader = "Tenure-Error"

// Reason is the name of a domain error in ErrorHeader. The values are
// part of the API: append new ones, never rename.
type Reason string

const (
	// ReasonInvalidArgument: the request was malformed or over a limit;
	// nothing changed.
	ReasonInvalidArgument Reason = "invalid-argument"
	// ReasonSessionNotFound: the session does not exist (it expired or was
	// closed); everything it held is released.
	ReasonSessionNotFound Reason = "session-not-found"
	// ReasonLeaseNotFound: no lease has that name.
	ReasonLeaseNotFound Reason = "lease-not-found"
	// ReasonKeyNotFound: no key has that name.
	ReasonKeyNotFound Reason = "key-not-found"
	// ReasonNotHolder: the token named is not a current holder's.
	ReasonNotHolder Reason = "not-holder"
	// ReasonLocked: a non-waiting acquire found the lease full.
	ReasonLocked Reason = "locked"
	// ReasonCompareFailed: a compare-and-swap's compare did not hold.
	ReasonCompareFailed Reason = "compare-failed"
	// ReasonCapacityMismatch: an acquire named a capacity other than the
	// lease's.
	ReasonCapacityMismatch Reason = "capacity-mismatch"
	// ReasonNotWaiting: a cancel named a session that does not wait.
	ReasonNotWaiting Reason = "not-waiting"
	// ReasonTooManyWaiters: the lease's queue is at --max-waiters-per-lease.
	ReasonTooManyWaiters Reason = "too-many-waiters"
	// ReasonTooManySessions: the identity has --max-sessions-per-identity
	// sessions open.
	ReasonTooManySessions Reason = "too-many-sessions"
	// ReasonDiskFull: the node's disk is nearly full; writes that add
	// state are refused, releases and deletes still work.
	ReasonDiskFull Reason = "disk-full"
	// ReasonNoSpace: the NOSPACE alarm is raised, a node having held its
	// storage quota (--quota-backend-bytes); writes that add data are
	// refused until an operator disarms it, reads, deletes and releases
	// still work.
	ReasonNoSpace Reason = "no-space"
	// ReasonNotLeader: this node does not lead, and nothing was proposed:
	// retrying elsewhere is safe.
	ReasonNotLeader Reason = "not-leader"
	// ReasonLeadershipLost: leadership ended after the command entered the
	// log; it may still commit.
	ReasonLeadershipLost Reason = "leadership-lost"
	// ReasonShuttingDown: the node is closing; nothing was proposed.
	ReasonShuttingDown Reason = "shutting-down"
	// ReasonWatchLagged: the watcher fell too far behind the history.
	ReasonWatchLagged Reason = "watch-lagged"
	// ReasonCompacted: the start revision is older than the history kept.
	ReasonCompacted Reason = "compacted"
	// ReasonWaitCancelled: a parked acquire's place was cancelled while its
	// session lives on; retry.
	ReasonWaitCancelled Reason = "wait-cancelled"
	// ReasonDeadlineExceeded: the call ran out of time on the server.
	ReasonDeadlineExceeded Reason = "deadline-exceeded"
	// ReasonCanceled: the call was cancelled.
	ReasonCanceled Reason = "canceled"
	// ReasonUnauthenticated: the call carried no credentials the server
	// accepts (no token or certificate, an unknown or expired token, a
	// certificate from another CA); nothing changed.
	ReasonUnauthenticated Reason = "unauthenticated"
	// ReasonPermissionDenied: the caller is known but the policy does not
	// allow this call; nothing changed.
	ReasonPermissionDenied Reason = "permission-denied"
	// ReasonRateLimited: the caller is over its per-principal request
	// rate; nothing changed, retry later.
	ReasonRateLimited Reason = "rate-limited"
	// ReasonNotSupported: the cluster does not run this yet, because a
	// member runs an older build; nothing changed. Upgrade every member.
	ReasonNotSupported Reason = "not-supported"
)

// Reasons lists every Reason, so that tests can check that the server
// sends only these and the client maps each one.
var Reasons = []Reason{
	ReasonInvalidArgument, ReasonSessionNotFound, ReasonLeaseNotFound,
	ReasonKeyNotFound, ReasonNotHolder, ReasonLocked, ReasonCompareFailed,
	ReasonCapacityMismatch, ReasonNotWaiting, ReasonTooManyWaiters,
	ReasonTooManySessions, ReasonDiskFull, ReasonNotLeader,
	ReasonLeadershipLost, ReasonShuttingDown, ReasonWatchLagged,
	ReasonCompacted, ReasonWaitCancelled, ReasonDeadlineExceeded,
	ReasonCanceled, ReasonUnauthenticated, ReasonPermissionDenied,
	ReasonRateLimited, ReasonNotSupported, ReasonNoSpace,
}

// NotSent reports whether a call that failed with r was refused before
// anything was proposed, so that repeating it elsewhere cannot apply it
// twice.
func (r Reason) NotSent() bool { return r == ReasonNotLeader || r == ReasonShuttingDown }

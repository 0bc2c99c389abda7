package bench

import (
	"context"
	"time"
)

// System names a system under test.
type System string

// The systems the harness knows.
const (
	Tenure System = "tenure"
	Etcd   System = "etcd"
)

// Client names the client Tenure is driven through; etcd is always
// driven through its own.
type Client string

// The clients Tenure can be driven through.
const (
	// ClientTenure is Tenure's own Go client on its native API.
	ClientTenure Client = "tenure"
	// ClientEtcd is etcd's clientv3 and concurrency packages on
	// Tenure's etcd API (tenure serve --etcd-listen): the same code, the
	// same calls, as against etcd.
	ClientEtcd Client = "etcd"
)

// The workloads reach a system only through these interfaces, each
// implemented once per system with its own Go client used as its
// documentation shows, so that a workload is written once and measures
// both the same way. They are the smallest common shape of the two
// clients: a connection (a client object, what one process holds), its
// sessions, and locks and elections held by a session.

// conn is one client object: Tenure's client.Client, etcd's
// clientv3.Client.
type conn interface {
	// session opens a session (Tenure) or a lease kept alive by the
	// client (etcd's concurrency.Session) with this TTL.
	session(ctx context.Context, ttl time.Duration) (session, error)
	// get returns key's mod revision, 0 when it does not exist.
	get(ctx context.Context, key string) (int64, error)
	// cas writes value if key's mod revision is rev (0: absent) and
	// returns the write's revision; errCompareFailed when it is not.
	cas(ctx context.Context, key string, rev int64, value string) (int64, error)
	// put writes key, for the growth workload's keys and history.
	put(ctx context.Context, key, value string) error
	// idleSession opens a session (Tenure) or grants a lease (etcd) with
	// this TTL that nobody keeps alive: what the server keeps per
	// session, with no heartbeat traffic.
	idleSession(ctx context.Context, ttl time.Duration) error
	// campaigners reports how many sessions campaign for (lead or wait
	// in) the election name.
	campaigners(ctx context.Context, name string) (int, error)
	// close drops the connections without ending any session: their
	// heartbeats stop, and the server expires them after their TTL, as
	// after a crash.
	close() error
}

type session interface {
	mutex(name string) locker
	election(name string) elector
	// grant takes the free lock name and keeps it until the session
	// ends, at the least cost the system's API allows: for counting
	// what the server keeps per held lock.
	grant(ctx context.Context, name string) error
	// lastAck is the send time of the newest heartbeat the server
	// acknowledged (or of the request that opened the session): the
	// server cannot expire the session before lastAck + TTL.
	lastAck() time.Time
	// lost is closed when the client finds the session gone.
	lost() <-chan struct{}
	// close ends the session on the server, releasing what it holds.
	close(ctx context.Context) error
}

type locker interface {
	lock(ctx context.Context) error
	unlock(ctx context.Context) error
}

type elector interface {
	campaign(ctx context.Context, value string) error
	resign(ctx context.Context) error
}

// counters names each system's server-side counters the heartbeat
// workload reads: renewals of a session's (lease's) deadline, and
// expiries.
type counters struct {
	heartbeats  string
	expiries    string
	expiryMatch []string // labels an expiries sample must have
}

func (s System) counters() counters {
	if s == Etcd {
		// Revocations count expiries and revokes alike; the heartbeat
		// workload revokes nothing while it measures.
		return counters{heartbeats: "etcd_debugging_lease_renewed_total", expiries: "etcd_debugging_lease_revoked_total"}
	}
	return counters{heartbeats: "tenure_lessor_heartbeats_total", expiries: "tenure_lessor_expiries_proposed_total", expiryMatch: []string{`kind="session"`}}
}

// Package fence lets the resources that lock holders call reject requests
// from a holder that has been replaced: the "workers double-check" half of
// ownership election (DESIGN.md safety rule 3).
//
// # Why a lock is not enough
//
// A lock tells its holder "you may write" at the moment it is granted, and
// the client keeps that belief only pessimistically (client.Mutex.Valid).
// But a holder can stop between checking and writing — a GC pause, a
// swapped-out process, a VM migration, a partition that holds its packets
// in a queue — for longer than the lease. Meanwhile the session expires,
// the lock goes to a successor, and the successor writes. Then the old
// holder wakes up, still sure it holds the lock, and its write lands on
// top of the successor's. No check on the holder's side can close this
// gap: the request may already be on the wire. Only the resource, which
// sees both writes, can refuse the late one.
//
// Tenure gives every grant a fencing token that strictly increases per
// lease (rule 1). The holder sends it with every request, and the
// resource refuses a request whose token is no longer the holder's.
//
// # The owner's side
//
// The token travels in the Tenure-Fence header as
// <namespace>/<name>:<token> (Header, Format, Parse). Transport wraps an
// http.RoundTripper and ClientInterceptor a Connect client so that every
// request carries the token of a Source — a client.Mutex, Semaphore,
// RWMutex or Election — and so that nothing is sent once the Source says
// the grant is no longer valid (ErrNotHolding): never an unfenced request,
// never a knowingly stale one.
//
// # The resource's side
//
// Middleware (net/http) and Interceptor (Connect handlers) read the header
// and ask a Policy. Missing, malformed, stale and undecidable tokens are
// refused with 428, 400, 409 and 503 (InvalidArgument, InvalidArgument,
// FailedPrecondition and Unavailable over Connect), and the handler gets
// the accepted token from FromContext. There are two policies:
//
//   - Validate asks the Tenure server, with a linearizable read, whether
//     the token is a current holder's. It is exact: once a successor has
//     been granted, the old token is refused even if the successor has
//     not written yet. It costs a round trip per request, and while no
//     Tenure endpoint answers the resource refuses everything (503).
//   - Monotonic remembers the highest token accepted per lease, in a
//     Store (NewMemoryStore, or NewFileStore to survive restarts), and
//     refuses lower ones. It is local and fast and keeps working when
//     Tenure is unreachable. But it only knows what it has seen: a stale
//     holder whose successor has not yet written here is accepted, and a
//     made-up high token is believed.
//
// They combine. Chain(Validate(c), Monotonic(store)) is exact, remembers
// only tokens the server vouched for, and also refuses an old holder's
// request that was validated a moment before its successor's — once the
// successor's has been accepted. A resource that must stay up while
// Tenure is down can fall back to Monotonic when Validate says
// ErrUnavailable, or validate only the first request of each token and
// trust Monotonic for the rest; write those as a PolicyFunc.
//
// # Locks taken through etcd
//
// Tenure speaks etcd's v3 API, so a resource may be guarded by a lock
// taken with etcdctl lock, a clientv3/concurrency Mutex or the Lock
// service. Such a holder has no Tenure token; it has its lock key and a
// KV revision at which it held the key (its create revision, or the
// revision it acquired at after waiting). It sends them in the
// Tenure-Fence-Key header as <key>:<revision> (KeyHeader, FormatKey,
// ParseKey) — from etcdctl lock's child, $ETCD_LOCK_KEY:$ETCD_LOCK_REV.
// Middleware and Interceptor take that header only when given
// WithLockKeys and a KeyPolicy; the Tenure-Fence form works as before,
// and a request carrying both is refused. The key policies mirror the
// token ones: ValidateKey asks the server (client.Client.ValidateKey)
// whether the key still exists as it was at that revision — a key
// deleted by an unlock or an expired lease, or made again by a newer
// holder, is refused — and MonotonicKey remembers the highest revision
// accepted per lock (LockKey.Lock: the key up to its last '/', which
// etcd's recipes share among a lock's holders). Revisions serve as
// tokens because a lock's next holder always acquires at a later KV
// revision than the last: its key is made, or its wait ends, after the
// last holder's key was deleted. KeyFromContext hands the handler the
// accepted key.
//
// # The last gap
//
// A policy checks a request before the handler writes, so two requests
// can still interleave between check and write. The strongest fence keeps
// the highest token in the resource's own storage and compares it in the
// same transaction as the write (UPDATE ... WHERE fence_token <= $token);
// FromContext hands the handler the token to do that.
//
// The package imports only client (and connect): nothing of the server.
// It is a module of its own, github.com/tenurehq/tenure/fence, requiring
// only the client's and the API's modules, so that a resource importing it
// inherits nothing of the server in its module graph either.
package fence

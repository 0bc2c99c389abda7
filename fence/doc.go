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

package fence

import (
	"errors"
	"fmt"

	"github.com/tenurehq/tenure/client"
)

// Errors callers branch on with errors.Is. Middleware and Interceptor
// map them to status codes in one table (see codes in middleware.go).
var (
	// ErrMissing is returned when a request carries no Tenure-Fence
	// header. Middleware answers 428 Precondition Required, Interceptor
	// InvalidArgument.
	ErrMissing = errors.New("missing fencing token")
	// ErrMalformed is returned by Parse, and by policies, when a token is
	// not <namespace>/<name>:<token> with a positive token. Middleware
	// answers 400 Bad Request, Interceptor InvalidArgument.
	ErrMalformed = errors.New("malformed fencing token")
	// ErrStale is returned by a Policy when a token is no longer the
	// holder's: a newer one has been granted (Validate) or already seen
	// (Monotonic). The error is a *StaleError. Middleware answers 409
	// Conflict, Interceptor FailedPrecondition.
	ErrStale = errors.New("stale fencing token")
	// ErrUnavailable is returned by a Policy that cannot decide: the
	// Tenure server is unreachable, or a Store cannot persist. The request
	// is refused, never let through. Middleware answers 503 Service
	// Unavailable, Interceptor Unavailable.
	ErrUnavailable = errors.New("fencing check unavailable")
	// ErrNotHolding is returned by Transport and ClientInterceptor instead
	// of sending a request when the Source's token is not valid: the
	// grant is lost, released, or was never held.
	ErrNotHolding = errors.New("not holding the lease")
	// ErrCorrupt is returned by NewFileStore when the file does not hold a
	// well-formed, checksummed record of tokens.
	ErrCorrupt = errors.New("fence store file is corrupt")
)

// StaleError is the error a Policy returns for a stale token. It matches
// ErrStale with errors.Is.
type StaleError struct {
	// Token is the token the request presented.
	Token client.Token
	// Current is the current holder's token (Validate), or the highest
	// token already accepted here (Monotonic, Seen true). 0 when the
	// lease has no holder.
	Current int64
	// Holder is the current holder's identity when the server said so.
	Holder string
	// Seen is true when Current is the highest token already accepted by
	// a Monotonic policy rather than the server's word.
	Seen bool
}

func (e *StaleError) Error() string {
	msg := "stale fencing token " + e.Token.String() + ": "
	switch {
	case e.Seen:
		return msg + fmt.Sprintf("a request with token %d was already accepted", e.Current)
	case e.Current == 0:
		return msg + "the lease has no holder"
	case e.Holder != "":
		return msg + fmt.Sprintf("the current holder's token is %d (holder %q)", e.Current, e.Holder)
	default:
		return msg + fmt.Sprintf("the current holder's token is %d", e.Current)
	}
}

// Unwrap makes errors.Is(err, ErrStale) work.
func (e *StaleError) Unwrap() error { return ErrStale }

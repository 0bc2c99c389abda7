package server

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/nativeapi"
)

// Limits bounds what a request may ask for. They are checked at the edge,
// before anything reaches the log, so bad input changes nothing.
type Limits struct {
	MaxNameBytes    int // key, lease name and identity length (native API)
	MaxValueBytes   int // key and lease values (native API)
	MaxRequestBytes int // a whole request message (native API)
	// EtcdMaxRequestBytes bounds a request of the etcd API as etcd's
	// --max-request-bytes does, and nothing else there: a key and a
	// value may fill it (etcdapi.ServerOptions). The native API's
	// limits above do not apply to it.
	EtcdMaxRequestBytes int
	// EtcdMaxResponseBytes caps the keys and values of one etcd answer
	// (a Range, or a Txn's Ranges and prev_kvs together), where etcd
	// leaves answers to gRPC's largest message; an answer past it is
	// refused without being built (etcdapi.DefaultMaxResponseBytes).
	EtcdMaxResponseBytes   int
	MinTTL, MaxTTL         time.Duration // session TTL and key TTL
	DefaultTTL             time.Duration
	MaxSessionsPerIdentity int // open sessions with one holder identity
	MaxWaitersPerLease     int
	MaxCapacity            int // semaphore size
	MaxLabels              int
	WatchHistory           int // events kept for watchers to replay or catch up
	// LeaseGCAfter is the gc_after of an acquire that names none: how long
	// an idle lease record is kept. Zero keeps records forever.
	LeaseGCAfter time.Duration
	// MetricsLeaseNames bounds the lease names with series of their own
	// in the per-lease metrics, first come; others are counted as
	// lease="(other)". A collected lease frees its slot.
	MetricsLeaseNames int
	// MaxHold bounds the max_hold a lease may ask for; 0 allows any.
	MaxHold time.Duration
	// MaxHoldGrace is how long a holder past its lease's max_hold has,
	// once asked to step down, before its grant is revoked.
	MaxHoldGrace time.Duration
	// RequestReadTimeout bounds the time to receive a unary request's
	// body, so that a client cannot hold a handler by sending it slowly.
	// Streams are exempt: their bodies last as long as they do. Zero
	// means no bound.
	RequestReadTimeout time.Duration
	// PipelineIdleTimeout closes an upgraded pipeline connection (with a
	// GoAway, so its client simply dials again) that has had no
	// operation in flight and read none for this long; pings do not
	// count. Zero means no bound.
	PipelineIdleTimeout time.Duration
	// MaxWaits bounds the waits parked on this node at once (Acquires
	// waiting in a queue, holders' grant watches), and MaxWatches the
	// lease and key watches open on it, over every caller; 0 is no
	// limit. The policy's waits and watches bound each principal.
	MaxWaits, MaxWatches int
}

// DefaultLimits are DESIGN.md's limits.
func DefaultLimits() Limits {
	return Limits{
		MaxNameBytes:           512,
		MaxValueBytes:          64 << 10,
		MaxRequestBytes:        1 << 20,
		EtcdMaxRequestBytes:    etcdapi.DefaultMaxRequestBytes,
		EtcdMaxResponseBytes:   etcdapi.DefaultMaxResponseBytes,
		MinTTL:                 2 * time.Second,
		MaxTTL:                 24 * time.Hour,
		DefaultTTL:             10 * time.Second,
		MaxSessionsPerIdentity: 1024,
		MaxWaitersPerLease:     10000,
		MaxWaits:               100000,
		MaxWatches:             100000,
		MaxCapacity:            10000,
		MaxLabels:              64,
		WatchHistory:           65536,
		RequestReadTimeout:     10 * time.Second,
		PipelineIdleTimeout:    5 * time.Minute,
		LeaseGCAfter:           time.Hour,
		MaxHoldGrace:           30 * time.Second,
		MetricsLeaseNames:      100,
	}
}

// ErrInvalidLimits is returned by Open (and Validate) for limits that
// cannot work together; the message names the field and its flag.
var ErrInvalidLimits = errors.New("invalid limits")

// Validate reports the first limit that is out of range, naming the
// field and the serve flag that sets it. Open calls it, so that a
// library user's partly filled Limits fails at once instead of refusing
// every request later. A zero MaxSessionsPerIdentity,
// MaxWaitersPerLease, MaxWaits or MaxWatches means no limit, and a zero
// RequestReadTimeout or PipelineIdleTimeout no bound.
func (l Limits) Validate() error {
	bad := func(field, flag string, v any, want string) error {
		return fmt.Errorf("%w: %s is %v; it must be %s (--%s)", ErrInvalidLimits, field, v, want, flag)
	}
	switch {
	case l.MaxNameBytes < 1:
		return bad("MaxNameBytes", "max-name-bytes", l.MaxNameBytes, "at least 1")
	case l.MaxValueBytes < 0:
		return bad("MaxValueBytes", "max-value-bytes", l.MaxValueBytes, "0 or more")
	case l.MaxRequestBytes < 1024:
		return bad("MaxRequestBytes", "max-request-bytes", l.MaxRequestBytes, "at least 1024")
	case l.EtcdMaxRequestBytes < 1024 || l.EtcdMaxRequestBytes > maxEtcdRequestBytes:
		return bad("EtcdMaxRequestBytes", "etcd-max-request-bytes", l.EtcdMaxRequestBytes, fmt.Sprintf("between 1024 and %d (8 MiB)", maxEtcdRequestBytes))
	case l.EtcdMaxResponseBytes < 1024 || l.EtcdMaxResponseBytes > math.MaxInt32:
		return bad("EtcdMaxResponseBytes", "etcd-max-response-bytes", l.EtcdMaxResponseBytes, fmt.Sprintf("between 1024 and %d (gRPC's largest message)", math.MaxInt32))
	case l.RequestReadTimeout < 0:
		return bad("RequestReadTimeout", "request-read-timeout", l.RequestReadTimeout, "0 (no bound) or more")
	case l.PipelineIdleTimeout < 0:
		return bad("PipelineIdleTimeout", "pipeline-idle-timeout", l.PipelineIdleTimeout, "0 (no bound) or more")
	case l.MinTTL <= 0:
		return bad("MinTTL", "min-ttl", l.MinTTL, "positive")
	case l.MaxTTL < l.MinTTL:
		return bad("MaxTTL", "max-ttl", l.MaxTTL, fmt.Sprintf("at least MinTTL %v", l.MinTTL))
	case l.DefaultTTL < l.MinTTL || l.DefaultTTL > l.MaxTTL:
		return bad("DefaultTTL", "default-ttl", l.DefaultTTL, fmt.Sprintf("within MinTTL %v and MaxTTL %v", l.MinTTL, l.MaxTTL))
	case l.MaxSessionsPerIdentity < 0:
		return bad("MaxSessionsPerIdentity", "max-sessions-per-identity", l.MaxSessionsPerIdentity, "0 (no limit) or more")
	case l.MaxWaitersPerLease < 0:
		return bad("MaxWaitersPerLease", "max-waiters-per-lease", l.MaxWaitersPerLease, "0 (no limit) or more")
	case l.MaxWaits < 0:
		return bad("MaxWaits", "max-waits", l.MaxWaits, "0 (no limit) or more")
	case l.MaxWatches < 0:
		return bad("MaxWatches", "max-watches", l.MaxWatches, "0 (no limit) or more")
	case l.MaxCapacity < 1:
		return bad("MaxCapacity", "max-capacity", l.MaxCapacity, "at least 1")
	case l.MaxLabels < 0:
		return bad("MaxLabels", "max-labels", l.MaxLabels, "0 or more")
	case l.WatchHistory < 1:
		return bad("WatchHistory", "watch-history", l.WatchHistory, "at least 1")
	case l.LeaseGCAfter < 0 || l.LeaseGCAfter > nativeapi.MaxGCAfter:
		return bad("LeaseGCAfter", "lease-gc-after", l.LeaseGCAfter, "0 (keep forever) up to "+nativeapi.MaxGCAfter.String())
	case l.MetricsLeaseNames < 0:
		return bad("MetricsLeaseNames", "metrics-lease-names", l.MetricsLeaseNames, "0 or more")
	case l.MaxHold < 0:
		return bad("MaxHold", "max-hold-limit", l.MaxHold, "0 (any) or more")
	case l.MaxHoldGrace < 0:
		return bad("MaxHoldGrace", "max-hold-grace", l.MaxHoldGrace, "0 or more")
	}
	return nil
}

// maxEtcdRequestBytes bounds --etcd-max-request-bytes: within the 10 MiB
// etcd recommends as its largest, and inside the 64 MiB that a log entry
// (raft-wal's MaxEntrySize) and a raft message between peers (raftnode's
// frame limit) may take even in the JSON log of a cluster not yet at
// version 6, which writes a byte as up to six ("\ufffd").
const maxEtcdRequestBytes = 8 << 20

// native is what the native API checks its requests against.
func (l Limits) native() nativeapi.Limits {
	return nativeapi.Limits{
		MaxNameBytes:           l.MaxNameBytes,
		MaxValueBytes:          l.MaxValueBytes,
		MaxRequestBytes:        l.MaxRequestBytes,
		MinTTL:                 l.MinTTL,
		MaxTTL:                 l.MaxTTL,
		DefaultTTL:             l.DefaultTTL,
		MaxSessionsPerIdentity: l.MaxSessionsPerIdentity,
		MaxWaitersPerLease:     l.MaxWaitersPerLease,
		MaxCapacity:            l.MaxCapacity,
		MaxLabels:              l.MaxLabels,
		LeaseGCAfter:           l.LeaseGCAfter,
		MaxHold:                l.MaxHold,
		PipelineIdleTimeout:    l.PipelineIdleTimeout,
	}
}

// MaxResponseBytes is etcdapi.Backend's: the etcd API's answers
// are capped at --etcd-max-response-bytes.
func (b etcdBackend) MaxResponseBytes() int { return b.s.cfg.Limits.EtcdMaxResponseBytes }

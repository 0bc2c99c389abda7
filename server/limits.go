package server

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits bounds what a request may ask for. They are checked at the edge,
// before anything reaches the log, so bad input changes nothing.
type Limits struct {
	MaxNameBytes           int           // key, lease name and identity length
	MaxValueBytes          int           // key and lease values
	MaxRequestBytes        int           // a whole request message
	MinTTL, MaxTTL         time.Duration // session TTL and key TTL
	DefaultTTL             time.Duration
	MaxSessionsPerIdentity int // open sessions with one holder identity
	MaxWaitersPerLease     int
	MaxCapacity            int // semaphore size
	MaxLabels              int
	WatchHistory           int // events kept for watchers to replay or catch up
}

// DefaultLimits are DESIGN.md's limits.
func DefaultLimits() Limits {
	return Limits{
		MaxNameBytes:           512,
		MaxValueBytes:          64 << 10,
		MaxRequestBytes:        1 << 20,
		MinTTL:                 2 * time.Second,
		MaxTTL:                 24 * time.Hour,
		DefaultTTL:             10 * time.Second,
		MaxSessionsPerIdentity: 1024,
		MaxWaitersPerLease:     10000,
		MaxCapacity:            10000,
		MaxLabels:              64,
		WatchHistory:           65536,
	}
}

// errInvalid marks request validation failures; the error table maps it
// to InvalidArgument.
var errInvalid = errors.New("invalid argument")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
}

// namespaceRE is a Kubernetes DNS label, so that a Tenure namespace can be
// named after the Kubernetes namespace of its users.
var namespaceRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

const defaultNamespace = "default"

func (l Limits) namespace(ns string) (string, error) {
	if ns == "" {
		return defaultNamespace, nil
	}
	if len(ns) > 63 || !namespaceRE.MatchString(ns) {
		return "", invalid("namespace %q must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit", ns)
	}
	return ns, nil
}

// name checks a lease name, key or identity.
func (l Limits) name(what, s string) error {
	if s == "" {
		return invalid("%s is empty", what)
	}
	if len(s) > l.MaxNameBytes {
		return invalid("%s is %d bytes, over the limit of %d bytes (--max-name-bytes)", what, len(s), l.MaxNameBytes)
	}
	if !utf8.ValidString(s) {
		return invalid("%s is not valid UTF-8", what)
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return invalid("%s has a control character at byte %d", what, i)
	}
	return nil
}

func (l Limits) value(what, v string) error {
	if len(v) > l.MaxValueBytes {
		return invalid("%s is %d bytes, over the limit of %d bytes (--max-value-bytes)", what, len(v), l.MaxValueBytes)
	}
	return nil
}

// ttl checks a TTL; zero means def.
func (l Limits) ttl(what string, d, def time.Duration) (time.Duration, error) {
	if d == 0 {
		d = def
	}
	if d < l.MinTTL || d > l.MaxTTL {
		return 0, invalid("%s %v is outside %v..%v (--min-ttl, --max-ttl)", what, d, l.MinTTL, l.MaxTTL)
	}
	return d, nil
}

func (l Limits) labels(what string, labels map[string]string) error {
	if len(labels) > l.MaxLabels {
		return invalid("%s has %d labels, over the limit of %d", what, len(labels), l.MaxLabels)
	}
	for k, v := range labels {
		if err := labelKey(k); err != nil {
			return invalid("%s: %v", what, err)
		}
		if len(v) > 63 || !labelValueRE.MatchString(v) {
			return invalid("%s: label %q value %q must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", what, k, v)
		}
	}
	return nil
}

// Label syntax follows Kubernetes, so selectors read the same in both.
var (
	labelNameRE  = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValueRE = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	// labelPrefixRE is a DNS subdomain, so a prefix can hold no ',', '='
	// or space that would make the label impossible to select.
	labelPrefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func labelKey(k string) error {
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if len(prefix) > 253 || !labelPrefixRE.MatchString(prefix) {
			return fmt.Errorf("label key %q prefix must be a DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', like example.com", k)
		}
		name = rest
	}
	if len(name) > 63 || !labelNameRE.MatchString(name) {
		return fmt.Errorf("label key %q must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", k)
	}
	return nil
}

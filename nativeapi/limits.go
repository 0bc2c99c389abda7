package nativeapi

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/statemachine"
)

// Limits bounds what a native request may ask for. They are checked
// here, at the edge, before anything reaches the log, so that bad input
// changes nothing; each refusal names the field, the limit and the
// serve flag that sets it. The server's Limits carry them (with the
// etcd API's and the node's own), and Validate them there.
type Limits struct {
	MaxNameBytes           int // key, lease name and identity length
	MaxValueBytes          int // key and lease values
	MaxRequestBytes        int // a whole request message, a pipelined one too
	MinTTL, MaxTTL         time.Duration
	DefaultTTL             time.Duration
	MaxSessionsPerIdentity int
	MaxWaitersPerLease     int
	MaxCapacity            int // semaphore size
	MaxLabels              int
	LeaseGCAfter           time.Duration // gc_after when a request names none
	MaxHold                time.Duration // 0: any max_hold
	PipelineIdleTimeout    time.Duration // 0: no bound (pipeidle.go)
}

// MaxGCAfter bounds gc_after: ten years, far from the int64 nanoseconds
// that date a deletion.
const MaxGCAfter = 10 * 365 * 24 * time.Hour

// gcAfter is a request's gc_after: the server's default when absent.
func (l Limits) gcAfter(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return l.LeaseGCAfter, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, Invalid("gc_after: %v", err)
	}
	v := d.AsDuration()
	if v < 0 || v > MaxGCAfter {
		return 0, Invalid("gc_after %v is outside 0 (keep forever) .. %v", v, MaxGCAfter)
	}
	return v, nil
}

// ErrInvalid marks request validation failures; the error table maps it
// to InvalidArgument.
var ErrInvalid = errors.New("invalid argument")

// Invalid is a request validation failure: the message names the field
// and what is wrong with it.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// namespace checks a request's namespace; "" means api.DefaultNamespace.
func (l Limits) namespace(ns string) (string, error) {
	if ns == "" {
		return api.DefaultNamespace, nil
	}
	if err := api.ValidateNamespace(ns); err != nil {
		return "", Invalid("%v", err)
	}
	return ns, nil
}

// name checks a lease name, key or identity.
func (l Limits) name(what, s string) error {
	if len(s) > l.MaxNameBytes {
		return Invalid("%s is %d bytes, over the limit of %d bytes (--max-name-bytes)", what, len(s), l.MaxNameBytes)
	}
	if err := api.ValidateName(what, s); err != nil {
		return Invalid("%v", err)
	}
	return nil
}

// readKey checks a key the native API reads, watches or deletes: name's
// rules but its length. --max-name-bytes bounds the keys the native API
// writes; the etcd API writes keys as long as its requests allow, as
// etcd does, and the native API reaches those too, within its own
// request's bound (--max-request-bytes). A read or a delete adds
// nothing to keep.
func (l Limits) readKey(what, s string) error {
	if err := api.ValidateName(what, s); err != nil {
		return Invalid("%v", err)
	}
	return nil
}

func (l Limits) value(what, v string) error {
	if len(v) > l.MaxValueBytes {
		return Invalid("%s is %d bytes, over the limit of %d bytes (--max-value-bytes)", what, len(v), l.MaxValueBytes)
	}
	return nil
}

// leaseID checks a request's namespace ("" for the default) and lease
// name.
func (l Limits) leaseID(ns, name string) (statemachine.LeaseID, error) {
	ns, err := l.namespace(ns)
	if err != nil {
		return statemachine.LeaseID{}, err
	}
	if err := l.leaseName(name); err != nil {
		return statemachine.LeaseID{}, err
	}
	return statemachine.LeaseID{Namespace: ns, Name: name}, nil
}

// leaseName checks a lease name: a name within MaxNameBytes, and the
// rest of api.LeaseName's rules (no '/').
func (l Limits) leaseName(name string) error {
	if len(name) > l.MaxNameBytes {
		return Invalid("name is %d bytes, over the limit of %d bytes (--max-name-bytes)", len(name), l.MaxNameBytes)
	}
	err := api.LeaseName{Namespace: api.DefaultNamespace, Name: name}.Validate()
	if errors.Is(err, api.ErrSlashInName) {
		return Invalid("%v (give the namespace in its own field)", err)
	}
	if err != nil {
		return Invalid("%v", err)
	}
	return nil
}

// ttl checks a TTL field of a request. Absent (nil) means def, and a def
// of 0 means no TTL. Present, it must lie within MinTTL..MaxTTL: in the
// protobuf JSON "ttl":"0s" is a present zero, distinct from leaving ttl
// out, and is refused rather than silently taken as the default.
func (l Limits) ttl(what string, msg *durationpb.Duration, def time.Duration) (time.Duration, error) {
	if msg == nil {
		return def, nil
	}
	if err := msg.CheckValid(); err != nil {
		return 0, Invalid("%s: %v", what, err)
	}
	d := msg.AsDuration()
	if d < l.MinTTL || d > l.MaxTTL {
		leaveOut := ""
		switch {
		case d == 0 && def == 0:
			leaveOut = fmt.Sprintf("; leave %s out for no TTL", what)
		case d == 0:
			leaveOut = fmt.Sprintf("; leave %s out for the default %v (--default-ttl)", what, def)
		}
		return 0, Invalid("%s %v is outside %v..%v (--min-ttl, --max-ttl)%s", what, d, l.MinTTL, l.MaxTTL, leaveOut)
	}
	return d, nil
}

func (l Limits) labels(what string, labels map[string]string) error {
	if len(labels) > l.MaxLabels {
		return Invalid("%s has %d labels, over the limit of %d", what, len(labels), l.MaxLabels)
	}
	for k, v := range labels {
		if err := labelKey(k); err != nil {
			return Invalid("%s: %v", what, err)
		}
		if len(v) > 63 || !labelValueRE.MatchString(v) {
			return Invalid("%s: label %q value %q must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", what, k, v)
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

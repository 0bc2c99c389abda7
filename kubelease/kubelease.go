// Package kubelease reads a Kubernetes coordination.k8s.io Lease back
// from the bytes kube-apiserver stores under its etcd key
// <prefix>/leases/<namespace>/<name>, so that Tenure can show the
// cluster's own leases (the scheduler's, the controller manager's, each
// apiserver's, each node's) beside its own.
//
// Why a decoder of its own and not k8s.io/api: the core module serves
// the etcd API to kube-apiserver, it does not link Kubernetes. Two
// message types and one envelope are all it needs, and their field
// numbers are a wire contract Kubernetes cannot change without breaking
// every etcd it ever wrote to: runtime.Unknown{1 typeMeta{1 apiVersion,
// 2 kind}, 2 raw, 3 contentEncoding, 4 contentType} after the magic
// "k8s\x00", raw being Lease{1 metadata{1 name, 3 namespace},
// 2 spec{1 holderIdentity, 2 leaseDurationSeconds, 3 acquireTime,
// 4 renewTime, 5 leaseTransitions, 6 strategy, 7 preferredHolder}},
// times being MicroTime{1 seconds, 2 nanos}. The golden files in
// testdata were written by Kubernetes' own serializers (e2e/kube
// TestKubernetesLeaseGoldenBytes checks they still are).
//
// What it decodes is any bytes: anyone who may write a key under the
// prefix through the etcd API writes the value too. So Decode never
// fails loudly — a value that is not a Lease it can read (another kind,
// another group, garbage, a value encrypted at rest "k8s:enc:...", a
// truncated message) is simply not a Lease, and the caller skips the
// key. It allocates in proportion to the value and never recurses
// deeper than the two messages it knows.
package kubelease

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Lease is what Tenure shows of a Kubernetes Lease.
type Lease struct {
	// APIVersion is "coordination.k8s.io/v1" or "coordination.k8s.io/v1beta1".
	APIVersion string
	// Namespace and Name are the object's metadata, as stored; the key
	// says them too (see ParseKey), and a caller should trust the key.
	Namespace, Name string
	// HolderIdentity is "" when nobody holds the lease.
	HolderIdentity string
	// LeaseDurationSeconds is how long a holder that stops renewing
	// keeps the lease; 0 when unset.
	LeaseDurationSeconds int32
	// AcquireTime and RenewTime are zero when unset.
	AcquireTime, RenewTime time.Time
	// LeaseTransitions is how many times the holder changed, as the
	// holders counted it: Kubernetes' clients increment it themselves.
	LeaseTransitions int32
	Strategy         string
	PreferredHolder  string
}

// Expired reports whether the lease's holder is past renewTime +
// leaseDurationSeconds at now, as client-go's leader election judges
// it. A lease with no holder, no renew time or no duration is not
// expired: there is nothing to expire.
func (l Lease) Expired(now time.Time) bool {
	if l.HolderIdentity == "" || l.RenewTime.IsZero() || l.LeaseDurationSeconds <= 0 {
		return false
	}
	return !now.Before(l.RenewTime.Add(time.Duration(l.LeaseDurationSeconds) * time.Second))
}

// protobufMagic starts every value kube-apiserver stores as protobuf.
var protobufMagic = []byte("k8s\x00")

// Group is the API group of Lease.
const Group = "coordination.k8s.io"

// Decode reads a stored Lease value, protobuf (kube-apiserver's default)
// or JSON (--storage-media-type=application/json), and reports whether
// it is one. Never an error: see the package note. It neither modifies
// value nor keeps it: the strings it returns are copies, so a caller may
// pass a string's bytes without copying them.
func Decode(value []byte) (Lease, bool) {
	switch {
	case bytes.HasPrefix(value, protobufMagic):
		return decodeProtobuf(value[len(protobufMagic):])
	case len(bytes.TrimLeft(value, " \t\r\n")) > 0 && bytes.TrimLeft(value, " \t\r\n")[0] == '{':
		return decodeJSON(value)
	}
	return Lease{}, false
}

// isLeaseType reports whether apiVersion/kind name a Lease of a version
// whose shape this package knows.
func isLeaseType(apiVersion, kind string) bool {
	return kind == "Lease" && (apiVersion == Group+"/v1" || apiVersion == Group+"/v1beta1")
}

func decodeProtobuf(b []byte) (Lease, bool) {
	var apiVersion, kind, encoding string
	var raw []byte
	ok := fields(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch {
		case num == 1 && typ == protowire.BytesType:
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte) bool {
				switch {
				case num == 1 && typ == protowire.BytesType:
					apiVersion = string(v)
				case num == 2 && typ == protowire.BytesType:
					kind = string(v)
				}
				return true
			})
		case num == 2 && typ == protowire.BytesType:
			raw = v
		case num == 3 && typ == protowire.BytesType:
			encoding = string(v)
		}
		return true
	})
	if !ok || encoding != "" || !isLeaseType(apiVersion, kind) {
		return Lease{}, false
	}
	l := Lease{APIVersion: apiVersion}
	ok = fields(raw, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch {
		case num == 1 && typ == protowire.BytesType:
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte) bool {
				switch {
				case num == 1 && typ == protowire.BytesType:
					l.Name = string(v)
				case num == 3 && typ == protowire.BytesType:
					l.Namespace = string(v)
				}
				return true
			})
		case num == 2 && typ == protowire.BytesType:
			return l.decodeSpec(v)
		}
		return true
	})
	return l, ok
}

func (l *Lease) decodeSpec(b []byte) bool {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch {
		case num == 1 && typ == protowire.BytesType:
			l.HolderIdentity = string(v)
		case num == 2 && typ == protowire.VarintType:
			l.LeaseDurationSeconds = int32(varint(v))
		case num == 3 && typ == protowire.BytesType:
			return microTime(v, &l.AcquireTime)
		case num == 4 && typ == protowire.BytesType:
			return microTime(v, &l.RenewTime)
		case num == 5 && typ == protowire.VarintType:
			l.LeaseTransitions = int32(varint(v))
		case num == 6 && typ == protowire.BytesType:
			l.Strategy = string(v)
		case num == 7 && typ == protowire.BytesType:
			l.PreferredHolder = string(v)
		}
		return true
	})
}

// microTime reads a meta/v1 MicroTime (Timestamp's shape) into t.
func microTime(b []byte, t *time.Time) bool {
	var sec, nsec int64
	ok := fields(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch {
		case num == 1 && typ == protowire.VarintType:
			sec = int64(varint(v))
		case num == 2 && typ == protowire.VarintType:
			nsec = int64(int32(varint(v)))
		}
		return true
	})
	// Beyond year 9999 or before year 1 a time neither renders nor
	// compares usefully; Kubernetes never writes one.
	if !ok || sec < -62135596800 || sec > 253402300799 || nsec < 0 || nsec > 999999999 {
		return false
	}
	*t = time.Unix(sec, nsec).UTC()
	return true
}

// varint is the value of a VarintType field as fields passes it: its
// encoding, so that every callback takes bytes.
func varint(b []byte) uint64 {
	v, _ := protowire.ConsumeVarint(b)
	return v
}

// fields calls fn with each field of the message b, in order, and
// reports whether b parsed to its end and every fn returned true. A
// varint's value is passed as its encoding (see varint); groups and
// fixed-width fields are skipped.
func fields(b []byte, fn func(protowire.Number, protowire.Type, []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v []byte
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			_, n = protowire.ConsumeVarint(b)
			if n >= 0 {
				v = b[:n]
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return false
		}
		b = b[n:]
		if v != nil || typ == protowire.BytesType {
			if !fn(num, typ, v) {
				return false
			}
		}
	}
	return true
}

// jsonLease is the JSON a Lease is stored as: the same names as the
// protobuf's fields, times in RFC 3339 with microseconds.
type jsonLease struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		HolderIdentity       *string `json:"holderIdentity"`
		LeaseDurationSeconds *int32  `json:"leaseDurationSeconds"`
		AcquireTime          *string `json:"acquireTime"`
		RenewTime            *string `json:"renewTime"`
		LeaseTransitions     *int32  `json:"leaseTransitions"`
		Strategy             *string `json:"strategy"`
		PreferredHolder      *string `json:"preferredHolder"`
	} `json:"spec"`
}

func decodeJSON(b []byte) (Lease, bool) {
	var j jsonLease
	if err := json.Unmarshal(b, &j); err != nil || !isLeaseType(j.APIVersion, j.Kind) {
		return Lease{}, false
	}
	l := Lease{APIVersion: j.APIVersion, Namespace: j.Metadata.Namespace, Name: j.Metadata.Name}
	s := j.Spec
	l.HolderIdentity = deref(s.HolderIdentity)
	l.LeaseDurationSeconds = deref(s.LeaseDurationSeconds)
	l.LeaseTransitions = deref(s.LeaseTransitions)
	l.Strategy = deref(s.Strategy)
	l.PreferredHolder = deref(s.PreferredHolder)
	for _, tm := range []struct {
		s  *string
		to *time.Time
	}{{s.AcquireTime, &l.AcquireTime}, {s.RenewTime, &l.RenewTime}} {
		if tm.s == nil {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, *tm.s)
		if err != nil || t.Year() < 1 || t.Year() > 9999 {
			return Lease{}, false
		}
		*tm.to = t.UTC()
	}
	return l, true
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// KeysPrefix is the prefix of the keys under which kube-apiserver with
// --etcd-prefix prefix stores Leases: prefix + "/leases/" (a trailing
// "/" on prefix is dropped, as the apiserver's path.Join does).
func KeysPrefix(prefix string) string {
	return strings.TrimSuffix(prefix, "/") + "/leases/"
}

// ParseKey splits a key under keysPrefix (KeysPrefix's result) into
// the Lease's namespace and name, and reports whether it has that
// shape: exactly two non-empty segments. Any bytes otherwise: the caller
// escapes them for display.
func ParseKey(keysPrefix, key string) (namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(key, keysPrefix)
	if !found {
		return "", "", false
	}
	namespace, name, found = strings.Cut(rest, "/")
	if !found || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", false
	}
	return namespace, name, true
}

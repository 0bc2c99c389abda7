package api

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultNamespace is the namespace of a lease whose namespace is left
// out.
const DefaultNamespace = "default"

// LeaseName names a lease: a namespace and a name in it. It is written
// "namespace/name" wherever one string must carry both (the fence header,
// the CLI's output, events and logs), which is why a name may not hold
// '/' while a namespace, a DNS label, cannot.
type LeaseName struct {
	Namespace string
	Name      string
}

// NewLeaseName returns the lease name in namespace ns, DefaultNamespace
// when ns is "". It does not validate.
func NewLeaseName(ns, name string) LeaseName {
	if ns == "" {
		ns = DefaultNamespace
	}
	return LeaseName{Namespace: ns, Name: name}
}

// String is "namespace/name".
func (n LeaseName) String() string { return n.Namespace + "/" + n.Name }

// ParseLeaseName reads "namespace/name" and validates it. The namespace
// ends at the first '/': a DNS label holds none.
func ParseLeaseName(s string) (LeaseName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return LeaseName{}, fmt.Errorf("lease %q has no '/' between namespace and name", s)
	}
	n := LeaseName{Namespace: ns, Name: name}
	if err := n.Validate(); err != nil {
		return LeaseName{}, err
	}
	return n, nil
}

// ErrSlashInName is matched by Validate's error for a name holding '/',
// which callers usually meant as "namespace/name": they add how to give
// the namespace in their own terms.
var ErrSlashInName = errors.New("lease names may not contain '/', which separates namespace and name in \"namespace/name\"")

// Validate reports what is wrong with n, or nil: the namespace must be a
// DNS label (so a Tenure namespace can be named after a Kubernetes one),
// and the name non-empty UTF-8 without control characters or '/'. The
// name's length limit is the server's configuration (--max-name-bytes),
// so only the server checks it.
func (n LeaseName) Validate() error {
	if err := ValidateNamespace(n.Namespace); err != nil {
		return err
	}
	if err := ValidateName("name", n.Name); err != nil {
		return err
	}
	if i := strings.IndexByte(n.Name, '/'); i >= 0 {
		return fmt.Errorf("name %q has a '/' at byte %d; %w", n.Name, i, ErrSlashInName)
	}
	return nil
}

// ValidateNamespace reports what is wrong with a namespace, or nil.
func ValidateNamespace(ns string) error {
	if ns == "" {
		return errors.New("namespace is empty")
	}
	if len(ns) > 63 || !isDNSLabel(ns) {
		return fmt.Errorf("namespace %q must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit", ns)
	}
	return nil
}

// isDNSLabel reports whether s matches a Kubernetes DNS label's
// ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ (length aside). It is written out
// because every call that names a lease checks it: the regexp cost 4% of
// the server's CPU on one client's Lock+Unlock pairs.
func isDNSLabel(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// ValidateName reports what is wrong with a name of the kind what (a
// lease name, key or identity), or nil: it must be non-empty UTF-8
// without control characters. Length is the caller's limit.
func ValidateName(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return fmt.Errorf("%s has a control character at byte %d", what, i)
	}
	return nil
}

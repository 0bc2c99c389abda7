package fence

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tenurehq/tenure/client"
)

// Header is the HTTP header (and Connect metadata key) that carries a
// holder's fencing token, in the form <namespace>/<name>:<token>, e.g.
//
//	Tenure-Fence: default/db-writer:42
const Header = "Tenure-Fence"

// Format returns t in the header form <namespace>/<name>:<token>.
func Format(t client.Token) string { return t.String() }

// Parse reads a token in the header form <namespace>/<name>:<token>.
// The namespace is a DNS label and the server refuses '/' in lease names,
// so the one '/' separates them; the token is the decimal after the last
// ':', so a name may itself hold ':'.
// Surrounding white space is ignored. Errors match ErrMalformed and say
// what is wrong.
func Parse(s string) (client.Token, error) {
	v := strings.TrimSpace(s)
	if v == "" {
		return client.Token{}, malformed(s, "empty value")
	}
	slash := strings.IndexByte(v, '/')
	if slash < 0 {
		return client.Token{}, malformed(s, "no '/' between namespace and name")
	}
	colon := strings.LastIndexByte(v, ':')
	if colon < slash {
		return client.Token{}, malformed(s, "no ':' before the token")
	}
	digits := v[colon+1:]
	if digits == "" {
		return client.Token{}, malformed(s, "no token after ':'")
	}
	if strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return client.Token{}, malformed(s, fmt.Sprintf("token %q is not a decimal number", digits))
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return client.Token{}, malformed(s, fmt.Sprintf("token %s is larger than an int64", digits))
	}
	t := client.Token{Namespace: v[:slash], Name: v[slash+1 : colon], Token: n}
	if why := invalid(t); why != "" {
		return client.Token{}, malformed(s, why)
	}
	return t, nil
}

// check returns an ErrMalformed error when t could not have been granted
// by Tenure; policies run it on tokens that did not come through Parse.
func check(t client.Token) error {
	if why := invalid(t); why != "" {
		return malformed(t.String(), why)
	}
	return nil
}

// invalid says why t is malformed, or "" when it is not: its lease name
// breaks client.LeaseName's rules (the server's, except the name's
// length, whose limit is the server's configuration), or its token is not
// positive.
func invalid(t client.Token) string {
	if err := t.Lease().Validate(); err != nil {
		return err.Error()
	}
	if t.Token <= 0 {
		return fmt.Sprintf("token must be positive, got %d", t.Token)
	}
	return ""
}

func malformed(s, why string) error {
	return fmt.Errorf("%w %q: %s; want <namespace>/<name>:<token>, e.g. default/db-writer:42", ErrMalformed, s, why)
}

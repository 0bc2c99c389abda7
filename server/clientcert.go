package server

import (
	"crypto/tls"
	"errors"
	"net/http"

	"connectrpc.com/connect"
)

// errClientCertRequired answers a caller without a client certificate
// on a server that checks them and has no policy.
var errClientCertRequired = errors.New("a client certificate is required: this server takes calls only from holders of a certificate from its client CA (--client-ca-file); give the CLI --cert and --key")

// requireClientCert refuses, with unauthenticated, every request but the
// health checks that did not come with a verified client certificate,
// when the API's TLS asks for client certificates without requiring them
// (internal/certs.ServerConfig with a client CA) and no policy decides
// who may call. The handshake cannot require them itself: /healthz,
// /livez and /readyz must answer probes and readiness loops that hold no
// certificate, and a handshake knows nothing of paths. A certificate
// that is given is still checked in the handshake, and with a policy the
// authenticator checks callers instead.
func (s *Server) requireClientCert(next http.Handler) http.Handler {
	if s.cfg.TLS == nil || s.cfg.TLS.ClientAuth != tls.VerifyClientCertIfGiven {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.policyOn() || r.TLS != nil && len(r.TLS.VerifiedChains) > 0 || healthCheck(r) {
			next.ServeHTTP(w, r)
			return
		}
		ce := connect.NewError(connect.CodeUnauthenticated, errClientCertRequired)
		if ew := connect.NewErrorWriter(); ew.IsSupported(r) {
			_ = ew.Write(w, r, ce)
			return
		}
		// The pipeline's upgrade, the watch streams and the page: the
		// message as text, as they answer their own refusals.
		http.Error(w, ce.Message(), http.StatusUnauthorized)
	})
}

// healthCheck reports whether r asks one of the health endpoints, which
// answer anybody.
func healthCheck(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	switch r.URL.Path {
	case "/healthz", "/livez", "/readyz":
		return true
	}
	return false
}

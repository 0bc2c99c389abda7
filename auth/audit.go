package auth

import (
	"context"
	"log/slog"
)

// Auditor writes the audit trail: every administrative action and every
// denied request, one structured line each (JSON lines with
// --audit-log).
type Auditor struct{ log *slog.Logger }

// NewAuditor writes to l.
func NewAuditor(l *slog.Logger) *Auditor { return &Auditor{log: l} }

// Entry is one audited event.
type Entry struct {
	Principal string // "" when unauthenticated
	Action    string // the RPC or endpoint, or "policy.reload"
	Target    string // the lease, key, session, member or file
	Outcome   string // "allowed", "denied", "failed"
	Reason    string // why denied or failed
	Remote    string // the caller's address
}

// Record writes e.
func (a *Auditor) Record(ctx context.Context, e Entry) {
	if a == nil {
		return
	}
	level := slog.LevelInfo
	if e.Outcome != "allowed" {
		level = slog.LevelWarn
	}
	a.log.LogAttrs(ctx, level, "audit",
		slog.String("principal", e.Principal),
		slog.String("action", e.Action),
		slog.String("target", e.Target),
		slog.String("outcome", e.Outcome),
		slog.String("reason", e.Reason),
		slog.String("remote", e.Remote),
	)
}

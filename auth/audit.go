package auth

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Auditor writes the audit trail: every administrative action and every
// denied request, one structured line each (JSON lines with
// --audit-log). Denied lines are folded per remote address (see
// auditfold.go) so that a caller cannot flood the trail, and long
// targets and reasons are cut short. An Auditor is safe for concurrent
// use; the caller should call Close when finished, which writes the
// summaries of what was folded.
type Auditor struct {
	log *slog.Logger
	// limit denied lines per remote host are written in each window;
	// more are counted and summed up in one line when the window ends.
	limit  int
	window time.Duration
	// maxRemotes bounds the hosts tracked at once (see admit).
	maxRemotes int

	mu      sync.Mutex // guards remotes and closed
	remotes map[string]*remoteWindow
	closed  bool
}

// NewAuditor writes to l.
func NewAuditor(l *slog.Logger) *Auditor {
	return &Auditor{log: l, limit: DeniedPerWindow, window: FoldWindow, maxRemotes: maxFoldRemotes}
}

// Entry is one audited event.
type Entry struct {
	Principal string // "" when unauthenticated
	Action    string // the RPC or endpoint, or "policy.reload"
	Target    string // the lease, key, session, member or file
	Outcome   string // "allowed", "denied", "failed"
	Reason    string // why denied or failed
	Remote    string // the caller's address
}

// Record writes e, unless it is a denial folded into its remote's
// summary. Allowed and failed entries are never folded.
func (a *Auditor) Record(ctx context.Context, e Entry) {
	if a == nil {
		return
	}
	e.Target = truncate(e.Target, MaxTargetBytes)
	e.Reason = truncate(e.Reason, MaxReasonBytes)
	if e.Outcome == "denied" {
		write, summaries := a.admit(e, time.Now())
		a.writeSummaries(summaries)
		if !write {
			return
		}
	}
	a.write(ctx, e)
}

func (a *Auditor) write(ctx context.Context, e Entry, extra ...slog.Attr) {
	level := slog.LevelInfo
	if e.Outcome != "allowed" {
		level = slog.LevelWarn
	}
	a.log.LogAttrs(ctx, level, "audit", append([]slog.Attr{
		slog.String("principal", e.Principal),
		slog.String("action", e.Action),
		slog.String("target", e.Target),
		slog.String("outcome", e.Outcome),
		slog.String("reason", e.Reason),
		slog.String("remote", e.Remote),
	}, extra...)...)
}

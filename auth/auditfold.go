package auth

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"
	"unicode/utf8"
)

// Folding. Every refused request is audited, and a refusal costs the
// caller almost nothing: without a bound, one connection sending refused
// operations as fast as it can writes megabytes of audit log a second
// and buries the lines that matter. So denials are counted per remote
// host (the address without its port: a new connection must not buy a
// new allowance) and principal (so that one principal's flood does not
// hide another's refusals behind the same address, a NAT or a proxy) in
// fixed windows: the first DeniedPerWindow of a window are written as
// they come, the rest only counted, and when the window ends one line
// says how many were folded and from where. Nothing is
// lost from the count, so "how much was refused" stays answerable, and
// what is written per host is bounded by the window, not by the caller.
// Allowed and failed entries (administrative calls) are never folded.

const (
	// DeniedPerWindow is how many denied lines a remote host and
	// principal get written in full per FoldWindow: plenty for a client
	// that is refused by mistake, about 75 KB a second for one that
	// tries on purpose.
	DeniedPerWindow = 100
	// FoldWindow is the window denials are counted in.
	FoldWindow = time.Second
	// MaxTargetBytes and MaxReasonBytes bound an entry's target and
	// reason: a refused request's key may be as long as a whole request
	// (the check runs before the size limits), and the reason may quote
	// it.
	MaxTargetBytes = 256
	MaxReasonBytes = 1024
	// maxFoldRemotes bounds the hosts (and principals) counted at once;
	// past it, windows that are over are pruned, and if every one is
	// still in its window, new ones share one window named
	// overflowRemote.
	maxFoldRemotes = 4096
	overflowRemote = "(many remotes)"
)

// remoteWindow counts one remote host's and principal's denials in the
// current window.
type remoteWindow struct {
	host   string
	start  time.Time
	lines  int // denied lines written in this window
	folded int // denied entries counted, not written
	// What the folded entries had in common: a field they did not all
	// share reads "(several)".
	principal, action, target string
	timer                     *time.Timer // writes the summary when the window ends
}

// admit decides whether the denied entry e is written, and returns the
// summaries of windows it found over, to be written first.
func (a *Auditor) admit(e Entry, now time.Time) (write bool, summaries []summary) {
	host := remoteHost(e.Remote)
	key := host + "\x00" + e.Principal
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return true, nil
	}
	if a.remotes == nil {
		a.remotes = map[string]*remoteWindow{}
	}
	w := a.remotes[key]
	if w != nil && now.Sub(w.start) >= a.window {
		summaries = append(summaries, a.endLocked(key, w)...)
		w = nil
	}
	if w == nil {
		if len(a.remotes) >= a.maxRemotes {
			summaries = append(summaries, a.pruneLocked(now)...)
		}
		if len(a.remotes) >= a.maxRemotes {
			key, host = overflowRemote, overflowRemote
			if w = a.remotes[key]; w != nil && now.Sub(w.start) >= a.window {
				summaries = append(summaries, a.endLocked(key, w)...)
				w = nil
			}
		}
		if w == nil {
			w = &remoteWindow{host: host, start: now}
			a.remotes[key] = w
		}
	}
	if w.lines < a.limit {
		w.lines++
		return true, summaries
	}
	if w.folded == 0 {
		w.principal, w.action, w.target = e.Principal, e.Action, e.Target
		// The summary must be written even if this host never sends
		// again: the window's end is the last moment it is due.
		w.timer = time.AfterFunc(w.start.Add(a.window).Sub(now), func() { a.expire(key, w) })
	}
	w.folded++
	w.principal = same(w.principal, e.Principal)
	w.action = same(w.action, e.Action)
	w.target = same(w.target, e.Target)
	return false, summaries
}

// expire ends w's window when its timer fires, unless an entry ended it
// first.
func (a *Auditor) expire(key string, w *remoteWindow) {
	a.mu.Lock()
	var summaries []summary
	if a.remotes[key] == w {
		summaries = a.endLocked(key, w)
	}
	a.mu.Unlock()
	a.writeSummaries(summaries)
}

// summary is the line that ends a window which folded entries.
type summary struct {
	e      Entry
	folded int
}

// endLocked forgets the window w under key and returns its summary, if
// it folded anything.
func (a *Auditor) endLocked(key string, w *remoteWindow) []summary {
	delete(a.remotes, key)
	if w.folded == 0 {
		return nil
	}
	if w.timer != nil {
		w.timer.Stop()
	}
	return []summary{{folded: w.folded, e: Entry{
		Principal: w.principal,
		Action:    w.action,
		Target:    w.target,
		Outcome:   "denied",
		Reason:    fmt.Sprintf("folded %d denied entries from %s (%d written in full, at most %d per %v)", w.folded, w.host, w.lines, a.limit, a.window),
		Remote:    w.host,
	}}}
}

// pruneLocked ends every window that is over.
func (a *Auditor) pruneLocked(now time.Time) []summary {
	var summaries []summary
	for key, w := range a.remotes {
		if now.Sub(w.start) >= a.window {
			summaries = append(summaries, a.endLocked(key, w)...)
		}
	}
	return summaries
}

// writeSummaries writes summary lines; each carries "folded", the count.
func (a *Auditor) writeSummaries(summaries []summary) {
	for _, s := range summaries {
		a.write(context.Background(), s.e, slog.Int("folded", s.folded))
	}
}

// Close writes the summary of every window that folded entries and stops
// their timers; later entries are written unfolded. Safe to call twice.
func (a *Auditor) Close() {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.closed = true
	var summaries []summary
	for key, w := range a.remotes {
		summaries = append(summaries, a.endLocked(key, w)...)
	}
	a.mu.Unlock()
	a.writeSummaries(summaries)
}

func same(kept, v string) string {
	if kept == v {
		return kept
	}
	return "(several)"
}

// remoteHost is the host of a "host:port" address, or the address as
// it is when it has no port.
func remoteHost(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// truncate cuts s to at most max bytes, on a rune boundary, and says how
// long it was.
func truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "...(truncated, " + strconv.Itoa(len(s)) + " bytes)"
}

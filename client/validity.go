package client

import (
	"sync/atomic"
	"time"
)

// validity is a session's window of certain ownership: it lasts until the
// send time of the newest acknowledged heartbeat plus window (the
// validity factor times the TTL), measured on the monotonic clock.
//
// The send time, not the acknowledgement, because the server restarts
// the TTL when a heartbeat arrives, which is no earlier than it was sent:
// counting from the send can only underestimate the server's deadline.
// An answer that arrives late, or out of order with a newer one, never
// moves the window back. All methods are safe for concurrent use.
type validity struct {
	base    time.Time // anchors the offsets below to the monotonic clock
	window  time.Duration
	until   atomic.Int64 // nanoseconds since base
	lastAck atomic.Int64 // nanoseconds since base; the newest acknowledged send
}

// newValidity starts a window whose first send is now: the request that
// opens the session counts as its first heartbeat.
func newValidity(window time.Duration) *validity {
	v := &validity{base: time.Now(), window: window}
	v.until.Store(int64(window))
	return v
}

// now is the offset to stamp on a heartbeat as it is sent.
func (v *validity) now() time.Duration { return time.Since(v.base) }

// ack credits the answer to a heartbeat sent at sentAt (an offset from
// now): the window then lasts until sentAt + window, unless a newer send
// was already acknowledged.
func (v *validity) ack(sentAt time.Duration) {
	for {
		cur := v.lastAck.Load()
		if int64(sentAt) <= cur {
			return
		}
		if v.lastAck.CompareAndSwap(cur, int64(sentAt)) {
			v.until.Store(int64(sentAt) + int64(v.window))
			return
		}
	}
}

// valid reports whether the window is still open.
func (v *validity) valid() bool { return v.now() < time.Duration(v.until.Load()) }

// deadline is when the window closes unless another answer comes first.
func (v *validity) deadline() time.Time { return v.base.Add(time.Duration(v.until.Load())) }

//go:build !linux

package delayline

import "time"

// sleeper waits with a Go timer, whose resolution may be a millisecond
// or worse: figures below that are Linux's only.
type sleeper struct{}

// until waits until due and reports true, or reports false as soon as
// abort is closed.
func (s *sleeper) until(due time.Time, abort <-chan struct{}) bool {
	if d := time.Until(due); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-abort:
			return false
		}
	}
	select {
	case <-abort:
		return false
	default:
		return true
	}
}

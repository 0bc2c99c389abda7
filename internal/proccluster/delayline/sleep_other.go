//go:build !linux

package delayline

import "time"

// sleeper waits with time.Sleep, whose resolution may be a millisecond
// or worse: figures below that are Linux's only.
type sleeper struct{}

func (s *sleeper) until(due time.Time) {
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
}

package delayline

import (
	"runtime"
	"syscall"
	"time"
)

// prSetTimerSlack is prctl's PR_SET_TIMERSLACK (linux/prctl.h).
const prSetTimerSlack = 29

// sleeper waits for due times on a thread of its own whose timer slack
// is 1ns (see the package doc). It takes the thread only at the first
// wait, so a link with no delay costs no thread.
type sleeper struct{ locked bool }

// until waits until due and reports true, or reports false as soon as
// abort is closed. A Go timer waits out all but the last two
// milliseconds, where its resolution does not matter and abort can
// interrupt it; nanosleep waits the rest.
func (s *sleeper) until(due time.Time, abort <-chan struct{}) bool {
	if d := time.Until(due) - coarse; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-abort:
			t.Stop()
			return false
		}
	}
	d := time.Until(due)
	if d > 0 && !s.locked {
		runtime.LockOSThread()
		s.locked = true
		// Never unlocked: the slack is the thread's, and the runtime ends
		// a thread whose goroutine exits locked to it, instead of giving
		// another goroutine a thread with a changed timer slack.
		_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1, 0)
	}
	for d > 0 {
		ts := syscall.NsecToTimespec(int64(d))
		_ = syscall.Nanosleep(&ts, nil) // an interrupted sleep is resumed by the loop
		d = time.Until(due)
	}
	select {
	case <-abort:
		return false
	default:
		return true
	}
}

// coarse is how much of a wait a Go timer may take: it can wake a
// millisecond late.
const coarse = 2 * time.Millisecond

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

func (s *sleeper) until(due time.Time) {
	d := time.Until(due)
	if d <= 0 {
		return
	}
	if !s.locked {
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
}

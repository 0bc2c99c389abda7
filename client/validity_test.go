package client

import (
	"testing"
	"testing/synctest"
	"time"
)

// The window DESIGN.md safety rule 2 asks of Valid, on a fake clock: it
// counts from the send of the newest acknowledged heartbeat, never from
// its acknowledgement, and a late answer never moves it back.
func TestValidityCountsFromTheSendOfTheNewestAcknowledgedHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 4 * time.Second
		v := newValidity(ttl * 3 / 4) // opened now: valid for 3s

		time.Sleep(2999 * time.Millisecond)
		if !v.valid() {
			t.Fatal("1ms before 0.75×TTL after the open: got = not valid, expected: valid")
		}
		time.Sleep(time.Millisecond)
		if v.valid() {
			t.Fatal("0.75×TTL after the open, nothing acknowledged: got = valid, expected: not valid")
		}

		// A heartbeat sent at 3s is answered two seconds later: the
		// window runs from the send, to 6s, not from the answer.
		sent := v.now()
		time.Sleep(2 * time.Second)
		v.ack(sent)
		if !v.valid() {
			t.Fatal("after a late answer, still inside send+window: got = not valid, expected: valid")
		}
		if got, want := v.deadline().Sub(v.base), 6*time.Second; got != want {
			t.Fatalf("deadline got = %v after the open, expected: %v (send time + 0.75×TTL)", got, want)
		}

		// A newer send acknowledged first, then the answer to an older
		// one: the older answer does not shorten the window.
		older := v.now()
		time.Sleep(100 * time.Millisecond)
		newer := v.now()
		v.ack(newer)
		v.ack(older)
		if got, want := v.deadline().Sub(v.base), newer+3*time.Second; got != want {
			t.Fatalf("deadline after an out-of-order answer got = %v, expected: %v", got, want)
		}
		time.Sleep(3*time.Second - time.Millisecond)
		if !v.valid() {
			t.Fatal("1ms before the newer send's window ends: got = not valid, expected: valid")
		}
		time.Sleep(time.Millisecond)
		if v.valid() {
			t.Fatal("at the newer send's window end: got = valid, expected: not valid")
		}
	})
}

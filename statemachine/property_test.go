package statemachine

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"
)

// The property tests draw command sequences from a small universe (a few
// sessions, three leases, three keys, current and stale tokens, current and
// wrong epochs) so that contention, queues, delays and stale requests are
// common, and check the safety rules after every command.

var (
	propLeases = []LeaseID{{Namespace: "p", Name: "x"}, {Namespace: "p", Name: "y"}, {Namespace: "q", Name: "x"}}
	propKeys   = []string{"a", "a/b", "b"}
)

func TestProperties(t *testing.T) {
	t.Run("the safety rules hold after every command", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			w := newWorld()
			w.start(t)
			steps := rapid.IntRange(1, 100).Draw(t, "steps")
			for range steps {
				cmd := w.draw(t)
				w.step(t, w.tick(t), cmd)
			}
			w.checkKeyHistory(t, true)
		})
	})

	t.Run("a restored snapshot has identical state and identical future behaviour", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			w := newWorld()
			w.start(t)
			for range rapid.IntRange(0, 60).Draw(t, "steps before") {
				cmd := w.draw(t)
				w.step(t, w.tick(t), cmd)
			}
			snap := snapshotBytes(t, w.m)

			// Restore replaces whatever state the machine had.
			other := newWorld()
			for range rapid.IntRange(0, 10).Draw(t, "steps of the other machine") {
				cmd := other.draw(t)
				other.step(t, other.tick(t), cmd)
			}
			restored := other.m
			if err := restored.Restore(bytes.NewReader(snap)); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if got := snapshotBytes(t, restored); !bytes.Equal(got, snap) {
				t.Fatalf("restored snapshot:\ngot = %s\nexpected: %s", got, snap)
			}
			expect(t, "revision", restored.Revision(), w.m.Revision())
			expect(t, "epoch", restored.Epoch(), w.m.Epoch())
			expect(t, "identities", restored.identities, w.m.identities)
			expect(t, "bytes held, counted as applied and counted on restore", restored.Usage(), w.m.Usage())
			expect(t, "deadlines", restored.Deadlines(), w.m.Deadlines())
			for _, s := range w.m.Sessions() {
				h1, w1, n1 := w.m.SessionHoldings(s.ID)
				h2, w2, n2 := restored.SessionHoldings(s.ID)
				expect(t, "holdings", [3]any{h2, w2, n2}, [3]any{h1, w1, n1})
			}
			checkInvariants(t, restored)

			for range rapid.IntRange(0, 60).Draw(t, "steps after") {
				cmd := w.draw(t)
				now := w.tick(t)
				expected := w.step(t, now, cmd)
				got := restored.Apply(now, cmd)
				compareResults(t, cmd, expected, got)
			}
			if a, b := snapshotBytes(t, w.m), snapshotBytes(t, restored); !bytes.Equal(a, b) {
				t.Fatalf("final snapshot of the restored machine:\ngot = %s\nexpected: %s", b, a)
			}
		})
	})

	t.Run("two machines applying the same commands write the same snapshot", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			w := newWorld()
			twin := New()
			if v := rapid.SampledFrom([]int{0, 5}).Draw(t, "start version"); v > 0 {
				compareResults(t, v5, w.step(t, w.tick(t), v5), twin.Apply(w.now, v5))
			}
			for range rapid.IntRange(1, 80).Draw(t, "steps") {
				cmd := w.draw(t)
				now := w.tick(t)
				compareResults(t, cmd, w.step(t, now, cmd), twin.Apply(now, cmd))
			}
			if a, b := snapshotBytes(t, w.m), snapshotBytes(t, twin); !bytes.Equal(a, b) {
				t.Fatalf("snapshot of the twin:\ngot = %s\nexpected: %s", b, a)
			}
		})
	})
}

//go:build linux

package etcd

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// attempt runs ops on a fresh server pair from pool, stopped after.
func attempt(pool *pairPool, ops []operation) (*runResult, error) {
	p, err := pool.get()
	if err != nil {
		return nil, err
	}
	defer p.stop()
	var sides []*side
	defer func() {
		for _, s := range sides {
			s.close()
		}
	}()
	for _, tg := range []target{p.ref, p.sut} {
		s, err := dialSide(tg)
		if err != nil {
			return nil, err
		}
		sides = append(sides, s)
	}
	return run(sides, ops), nil
}

// shrinker cuts a sequence on which etcd and Tenure differ down to one
// that still makes them differ: it drops chunks of operations, halving
// the chunk until it is one (delta debugging), then makes operations
// simpler one at a time (operation.simpler), and repeats while either
// helps. Each candidate runs on a fresh server pair, so that what a
// candidate left behind cannot decide the next; a candidate is kept when
// any answer or event differs on it, and cut after the operation where
// they first do.
type shrinker struct {
	run      func(ops []operation) (*runResult, error) // attempt, on a pool
	deadline time.Time
	runs     int
	kept     int // candidates kept: 0 when the failure never came back
	best     []operation
	res      *runResult // best's run
}

// shrink shrinks ops, whose run went as res, until nothing more helps or
// the deadline passes, and leaves the result in best and res.
func (s *shrinker) shrink(ops []operation, res *runResult) {
	s.best, s.res = ops, res
	if cut := ops[:res.diff.at+1]; len(cut) < len(ops) {
		s.try(cut)
	}
	for !s.expired() {
		s.removeChunks()
		if !s.simplify() {
			return
		}
	}
}

func (s *shrinker) expired() bool { return time.Now().After(s.deadline) }

// try runs cand and keeps it when the two servers still differ on it.
func (s *shrinker) try(cand []operation) bool {
	if s.expired() {
		return false
	}
	res, err := s.run(cand)
	s.runs++
	if err != nil || res.diff == nil {
		return false
	}
	s.kept++
	s.best, s.res = cand, res
	if cut := cand[:res.diff.at+1]; len(cut) < len(cand) {
		s.try(cut)
	}
	return true
}

// removeChunks drops runs of operations, from halves down to single
// ones, until no single operation can go.
func (s *shrinker) removeChunks() {
	for n := 2; len(s.best) > 1 && !s.expired(); {
		size := (len(s.best) + n - 1) / n
		removed := false
		for start := 0; start < len(s.best) && !removed; start += size {
			cand := append(slices.Clone(s.best[:start]), s.best[min(start+size, len(s.best)):]...)
			removed = len(cand) > 0 && s.try(cand)
		}
		switch {
		case removed:
			n = max(n-1, 2)
		case size == 1:
			return
		default:
			n = min(2*n, len(s.best))
		}
	}
}

// simplify replaces operations with simpler variants, and tells whether
// any could be.
func (s *shrinker) simplify() bool {
	changed := false
	for i := 0; i < len(s.best) && !s.expired(); i++ {
		for again := true; again && i < len(s.best); {
			again = false
			for _, simpler := range s.best[i].simpler() {
				cand := slices.Clone(s.best)
				cand[i] = simpler
				if s.try(cand) {
					changed, again = true, true
					break
				}
			}
		}
	}
	return changed
}

// TestDifferentialShrinker shrinks a sequence on a fake run that differs when a put
// of "a" comes before a range of "x" with a limit, and expects just
// those two, the range without its other options.
func TestDifferentialShrinker(t *testing.T) {
	ops := generate(7, 300)
	ops = slices.Insert(ops, 250, operation(&rangeOp{r: keyRange{key: "x", kind: prefix}, limit: 2, serializable: true, keysOnly: true}))
	ops = slices.Insert(ops, 40, operation(&putOp{key: "a", value: "v", prevKV: true}))
	differs := func(ops []operation) *runResult {
		res := &runResult{n: len(ops)}
		put := false
		for i, o := range ops {
			switch o := o.(type) {
			case *putOp:
				put = put || o.key == "a"
			case *rangeOp:
				if put && o.r.key == "x" && o.limit > 0 {
					res.diff = &difference{at: i, what: "the answer"}
					return res
				}
			}
		}
		return res
	}
	s := &shrinker{
		run:      func(ops []operation) (*runResult, error) { return differs(ops), nil },
		deadline: time.Now().Add(time.Minute),
	}
	s.shrink(ops, differs(ops))
	got := strings.TrimSpace(script(s.best, false))
	want := `put "a" "v"` + "\n" + `range "x" limit=2`
	if got != want {
		t.Fatalf("shrunk to = %s, expected:\n%s", got, want)
	}
	t.Logf("%d operations shrunk to 2 in %d runs", len(ops), s.runs)
}

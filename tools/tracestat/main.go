// Command tracestat counts, in a Go execution trace of a server, what
// each operation costs the scheduler and the kernel: goroutine wake-ups
// and blocks, goroutines started, and system calls, each by the
// goroutine's entry function (and, for system calls, by which call).
// docs/benchmarks.md's per-operation breakdowns come from it:
//
//	tenure bench --workloads 1 --profile /tmp/prof ...
//	go run ./tools/tracestat -ops 1200 /tmp/prof/1-one-client-tenure-round1.trace
//
// -ops is the operations the server did in the trace's span (the
// workload's rate times the trace's length, one second by default); with
// it every count is printed per operation.
//
// It is a module of its own so that the trace reader
// (golang.org/x/exp/trace) is not a dependency of Tenure.
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/exp/trace"
)

func main() {
	ops := flag.Float64("ops", 0, "operations in the trace's span: counts are printed per operation (0: totals)")
	top := flag.Int("top", 12, "rows per table")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: tracestat [-ops N] [-top N] FILE.trace")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	c, err := count(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c.print(os.Stdout, *ops, *top)
}

// counts are a trace's totals, keyed by goroutine entry function.
type counts struct {
	span                                    trace.Time
	wakeups, blocks, created, syscalls      map[string]int
	syscallByCall                           map[string]int
	totalWake, totalBlock, totalGo, totalSC int
	// Wall time: how long system calls took, by call, and how long a
	// woken goroutine waited to run, by goroutine.
	syscallTime, runDelay map[string]trace.Time
}

func count(r io.Reader) (*counts, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	c := &counts{wakeups: map[string]int{}, blocks: map[string]int{}, created: map[string]int{}, syscalls: map[string]int{}, syscallByCall: map[string]int{},
		syscallTime: map[string]trace.Time{}, runDelay: map[string]trace.Time{}}
	inSyscall := map[trace.GoID]struct {
		call string
		at   trace.Time
	}{}
	woken := map[trace.GoID]trace.Time{} // runnable since
	entry := map[trace.GoID]string{}     // goroutine → its entry function
	// Wake-ups are counted when the woken goroutine's name is known,
	// which may be later: keep them per goroutine until the end.
	pendingWake := map[trace.GoID]int{}
	var first, last trace.Time
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read trace: %w", err)
		}
		if first == 0 {
			first = ev.Time()
		}
		last = ev.Time()
		if g := ev.Goroutine(); g != trace.NoGoroutine {
			if name := entryOf(ev.Stack()); name != "" {
				entry[g] = name
			}
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		g := st.Resource.Goroutine()
		if name := entryOf(st.Stack); name != "" {
			entry[g] = name
		}
		from, to := st.Goroutine()
		switch {
		case from == trace.GoNotExist && to == trace.GoRunnable:
			c.created[entryOf(st.Stack)]++
			c.totalGo++
		case from == trace.GoWaiting && to == trace.GoRunnable:
			pendingWake[g]++
			c.totalWake++
			woken[g] = ev.Time()
		case from == trace.GoRunnable && to == trace.GoRunning:
			if at, ok := woken[g]; ok {
				c.runDelay[nameOr(entry, g)] += ev.Time() - at
				delete(woken, g)
			}
		case from == trace.GoSyscall:
			if s, ok := inSyscall[g]; ok {
				c.syscallTime[s.call] += ev.Time() - s.at
				delete(inSyscall, g)
			}
		case from == trace.GoRunning && to == trace.GoWaiting:
			c.blocks[nameOr(entry, g)+" ("+st.Reason+")"]++
			c.totalBlock++
		case from == trace.GoRunning && to == trace.GoSyscall:
			c.syscalls[nameOr(entry, g)]++
			call := syscallOf(ev.Stack())
			c.syscallByCall[call]++
			c.totalSC++
			inSyscall[g] = struct {
				call string
				at   trace.Time
			}{call, ev.Time()}
		}
	}
	for g, n := range pendingWake {
		c.wakeups[nameOr(entry, g)] += n
	}
	c.span = last - first
	return c, nil
}

// entryOf is a stack's outermost frame: the goroutine's entry function.
func entryOf(s trace.Stack) string {
	var name string
	for f := range s.Frames() {
		name = f.Func
	}
	return name
}

// syscallOf is the syscall package function a stack entered the kernel
// through.
func syscallOf(s trace.Stack) string {
	isCall := func(fn string) bool {
		for _, p := range []string{"syscall.", "internal/syscall/", "golang.org/x/sys/unix."} {
			if strings.HasPrefix(fn, p) {
				return true
			}
		}
		return false
	}
	var name string
	for f := range s.Frames() {
		if isCall(f.Func) {
			name = f.Func
		} else if name != "" && !strings.HasPrefix(f.Func, "internal/") {
			break
		}
	}
	return cmp.Or(name, "(unknown)")
}

func nameOr(entry map[trace.GoID]string, g trace.GoID) string {
	return cmp.Or(entry[g], "(unknown)")
}

func (c *counts) print(w io.Writer, ops float64, top int) {
	per := func(n int) string {
		if ops > 0 {
			return fmt.Sprintf("%8.2f", float64(n)/ops)
		}
		return fmt.Sprintf("%8d", n)
	}
	unit := "total"
	if ops > 0 {
		unit = "per op"
	}
	fmt.Fprintf(w, "trace span %.3f s; %s\n", float64(c.span)/1e9, unit)
	table := func(title string, total int, m map[string]int) {
		fmt.Fprintf(w, "\n%s: %s\n", title, strings.TrimSpace(per(total)))
		type row struct {
			k string
			n int
		}
		var rows []row
		for k, n := range m {
			rows = append(rows, row{k, n})
		}
		slices.SortFunc(rows, func(a, b row) int { return cmp.Or(b.n-a.n, strings.Compare(a.k, b.k)) })
		for i, r := range rows {
			if i == top {
				break
			}
			fmt.Fprintf(w, "  %s  %s\n", per(r.n), r.k)
		}
	}
	table("goroutine wake-ups, by the woken goroutine", c.totalWake, c.wakeups)
	table("goroutine blocks, by goroutine (reason)", c.totalBlock, c.blocks)
	table("goroutines started, by entry function", c.totalGo, c.created)
	table("system calls, by goroutine", c.totalSC, c.syscalls)
	table("system calls, by call", c.totalSC, c.syscallByCall)
	micros := func(title string, m map[string]trace.Time, n map[string]int) {
		fmt.Fprintf(w, "\n%s (µs %s; mean µs each)\n", title, unit)
		type row struct {
			k string
			t trace.Time
		}
		var rows []row
		for k, t := range m {
			rows = append(rows, row{k, t})
		}
		slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(b.t, a.t) })
		for i, r := range rows {
			if i == top {
				break
			}
			total := float64(r.t) / 1e3
			if ops > 0 {
				total /= ops
			}
			mean := 0.0
			if n[r.k] > 0 {
				mean = float64(r.t) / 1e3 / float64(n[r.k])
			}
			fmt.Fprintf(w, "  %8.1f  %7.1f  %s\n", total, mean, r.k)
		}
	}
	micros("time in system calls, by call", c.syscallTime, c.syscallByCall)
	micros("time from woken to running, by goroutine", c.runDelay, c.wakeups)
}

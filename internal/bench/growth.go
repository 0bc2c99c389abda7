package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/client"
)

// --- 13: growth ---

// Issue 32's question is not how fast a server is when empty but how
// its cost grows with what it holds. runGrowth grows one kind of state
// at a time (a dimension) on a fresh server, in steps, and at each step
// reads the server's RSS and live heap and runs workloads 1 and 2 for a
// short window: whether a lock's latency and throughput stay flat when
// the server holds a million keys, sessions or revisions, or a hundred
// thousand watchers, and what each unit of state costs in memory (the
// slope of RSS over the steps).
//
// The state is made as fast as each system takes it: fillParallel calls
// at once over growthConns connections, through each system's own
// client (Tenure's pipelines its KV writes and opens sessions as unary
// calls; etcd's multiplexes everything on HTTP/2). A call that times
// out or loses its connection is tried again and counted: a server that
// stalls has not refused the state, and the stall is what the step's
// figures should show. Sessions are opened and never kept alive, with a
// TTL of an hour, longer than the run, so that what is measured is what
// the server keeps per session, not heartbeat traffic. Watches are made
// through etcd's clientv3 on both systems (Tenure's etcd API): Tenure's
// own client holds an HTTP/1.1 stream per watch, and a hundred thousand
// of those do not fit in one machine's ephemeral ports, while clientv3
// puts many watches on one gRPC stream; growthStreams streams carry
// them all.
//
// The time spent filling a dimension is bounded (growthSizes.fill): a
// system that cannot reach a step in that time, or refuses more state,
// or cannot serve the locks beside it, is recorded with the largest step
// it reached and measured and why (Result.Note), and the run goes on.

// fillParallel is how many calls the growth workload's fill has in
// flight at once, over growthConns connections.
const (
	fillParallel  = 256
	growthConns   = 4
	growthStreams = 64 // watch streams, over growthConns clients
)

// growthValue is every key's value: 100 bytes.
var growthValue = strings.Repeat("v", 100)

// growthHistoryKeys are the keys the history dimension overwrites.
const growthHistoryKeys = 100

// growthTTL is the idle sessions' TTL: longer than any run, within both
// servers' bounds (Tenure's --max-ttl defaults to 24h; etcd's largest
// lease TTL is 9,000,000,000s).
const growthTTL = time.Hour

// growthSizes are the growth workload's steps and windows.
type growthSizes struct {
	keys, sessions, watchers, history []int
	window, warmup                    time.Duration // of each step's workloads 1 and 2
	settle                            time.Duration // after filling, before RSS is read
	fill                              time.Duration // bound on the time spent filling one dimension's steps
	progress                          time.Duration // between progress lines while filling
}

// GrowthSteps override the growth workload's steps (nil: the defaults)
// and its bound on filling one dimension (0: the default).
type GrowthSteps struct {
	Keys, Sessions, Watchers, History []int
	Fill                              time.Duration
}

func growthSizesFor(short bool, d time.Duration) growthSizes {
	if short {
		// Big enough that each dimension's state adds megabytes to the
		// server's RSS, which the test checks grows with the state.
		// Fewer watchers: at 10,000 Tenure's lock pairs took longer
		// than the window (watch.Hub.Publish looks at every waiting
		// watcher), and the test needs figures, not that finding.
		steps := []int{1000, 10000}
		return growthSizes{keys: steps, sessions: steps, watchers: []int{500, 3000}, history: steps,
			window: min(d, 500*time.Millisecond), warmup: 100 * time.Millisecond, settle: 200 * time.Millisecond,
			fill: time.Minute, progress: 5 * time.Second}
	}
	return growthSizes{
		keys:     []int{1000, 10000, 100000, 300000, 1000000},
		sessions: []int{1000, 10000, 100000, 300000, 1000000},
		watchers: []int{100, 1000, 10000, 30000, 100000},
		history:  []int{10000, 100000, 300000, 1000000},
		window:   min(d, 2*time.Second), warmup: 500 * time.Millisecond, settle: 2 * time.Second,
		fill: 3 * time.Minute, progress: 10 * time.Second,
	}
}

func (g growthSizes) with(o GrowthSteps) growthSizes {
	for _, s := range []struct {
		to   *[]int
		from []int
	}{{&g.keys, o.Keys}, {&g.sessions, o.Sessions}, {&g.watchers, o.Watchers}, {&g.history, o.History}} {
		if s.from != nil {
			*s.to = slices.Clone(s.from)
		}
	}
	if o.Fill > 0 {
		g.fill = o.Fill
	}
	return g
}

// Check reports steps that are not positive or not increasing.
func (o GrowthSteps) Check() error {
	for _, s := range []struct {
		name  string
		steps []int
	}{{"keys", o.Keys}, {"sessions", o.Sessions}, {"watchers", o.Watchers}, {"history", o.History}} {
		for i, n := range s.steps {
			if n < 1 || (i > 0 && n <= s.steps[i-1]) {
				return fmt.Errorf("growth %s steps %v: each must be positive and larger than the one before", s.name, s.steps)
			}
		}
	}
	return nil
}

// dimension is one kind of state the growth workload grows.
type dimension struct {
	name string // "keys": the variant's prefix and --growth-<name>
	unit string // "key": for "RSS per key"
	// steps are the amounts of state at which the server is measured.
	steps []int
	// args are tenure serve's flags for this dimension's server.
	args []string
	// watches says the dimension needs etcd's API on Tenure.
	watches bool
	// op makes unit i of the state (0-based) through g.
	op func(ctx context.Context, g *grower, i int) error
}

func (g growthSizes) dimensions() []dimension {
	return []dimension{
		{name: "keys", unit: "key", steps: g.keys, op: func(ctx context.Context, g *grower, i int) error {
			return g.conns[i%len(g.conns)].put(ctx, fmt.Sprintf("/growth/key/%07d", i), growthValue)
		}},
		{name: "sessions", unit: "session", steps: g.sessions, op: func(ctx context.Context, g *grower, i int) error {
			return g.conns[i%len(g.conns)].idleSession(ctx, growthTTL)
		}},
		// Tenure refuses watches past --max-watches (100,000 by default),
		// which the largest step and workloads 1 and 2's own watches pass.
		{name: "watchers", unit: "watcher", steps: g.watchers, args: []string{"--max-watches", "0"}, watches: true,
			op: func(ctx context.Context, g *grower, i int) error {
				return g.watch(ctx, i, fmt.Sprintf("/growth/watch/%07d", i))
			}},
		// Tenure keeps only the last 10,000 revisions by default
		// (--auto-compaction-retention); 0 keeps them all, as etcd 3.4
		// does by default (it compacts only when told to).
		{name: "history", unit: "revision", steps: g.history, args: []string{"--auto-compaction-retention", "0"},
			op: func(ctx context.Context, g *grower, i int) error {
				return g.conns[i%len(g.conns)].put(ctx, fmt.Sprintf("/growth/history/%03d", i%growthHistoryKeys), growthValue)
			}},
	}
}

// grower holds the connections one dimension's state is made through.
type grower struct {
	conns   []conn
	watchCs []*clientv3.Client
	streams []context.Context // one per watch stream; the watches last as long as they do
}

func (g *grower) close() {
	closeConns(g.conns)
	for _, c := range g.watchCs {
		_ = c.Close()
	}
}

// watch opens a watch on key on stream i mod growthStreams and returns
// once the server has made it. clientv3 puts the watches of one client
// whose contexts carry the same metadata on one stream.
func (g *grower) watch(_ context.Context, i int, key string) error {
	s := i % len(g.streams)
	ch := g.watchCs[s%len(g.watchCs)].Watch(g.streams[s], key, clientv3.WithCreatedNotify())
	resp, ok := <-ch
	if !ok {
		return fmt.Errorf("watch %s: closed before it was made", key)
	}
	if err := resp.Err(); err != nil {
		return fmt.Errorf("watch %s: %w", key, err)
	}
	if !resp.Created {
		return fmt.Errorf("watch %s: first answer was not its creation", key)
	}
	return nil
}

// runGrowth runs each dimension on a server of its own: runOne's is
// stopped at once, since the dimensions' servers take other flags and
// no dimension should inherit another's state.
func runGrowth(ctx context.Context, e *env) ([]Result, error) {
	e.srv.Stop()
	var out []Result
	for _, d := range e.sz.growth.dimensions() {
		spec := e.spec
		spec.TenureArgs = append(slices.Clone(spec.TenureArgs), d.args...)
		spec.EtcdAPI = spec.EtcdAPI || d.watches
		srv, err := spec.Start(ctx, e.sys, 1)
		if err != nil {
			out = append(out, Result{Variant: d.name, Err: err.Error()})
			continue
		}
		de := *e
		de.srv, de.spec = srv, spec
		rs, err := de.grow(ctx, d)
		err = errors.Join(err, srv.Running())
		srv.Stop()
		if err != nil {
			if len(rs) == 0 || rs[len(rs)-1].Variant != d.name {
				rs = append(rs, Result{Variant: d.name})
			}
			rs[len(rs)-1].Err = err.Error()
		}
		out = append(out, rs...)
		if ctx.Err() != nil {
			break
		}
	}
	return out, nil
}

// grow fills d's steps one after the other on e.srv and measures each,
// then adds d's summary: the fitted RSS per unit and the goals' figures.
func (e *env) grow(ctx context.Context, d dimension) ([]Result, error) {
	gz := e.sz.growth
	settle := func() (int64, error) { return e.settledRSS(ctx, gz.settle) }
	rss0, err := settle()
	if err != nil {
		return nil, err
	}
	g := &grower{}
	defer g.close()
	for range growthConns {
		c, err := e.dial(ctx, dialOptions{})
		if err != nil {
			return nil, err
		}
		g.conns = append(g.conns, c)
	}
	if d.watches {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel() // before g.close, which closes the clients
		for range growthConns {
			c, err := clientv3.New(clientv3.Config{Endpoints: e.srv.EtcdEndpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), Context: wctx})
			if err != nil {
				return nil, fmt.Errorf("etcd client for watches: %w", err)
			}
			g.watchCs = append(g.watchCs, c)
		}
		for i := range growthStreams {
			g.streams = append(g.streams, metadata.AppendToOutgoingContext(wctx, "growth-stream", strconv.Itoa(i)))
		}
	}

	var out []Result
	var sizes []float64
	var rsses, lives []float64
	var p50s [2][]float64
	have, reached, measured := 0, 0, 0 // units made; the largest step filled; and measured
	var filling time.Duration          // spent filling so far, the windows left out
	var note string
	for _, step := range d.steps {
		began, before := time.Now(), have
		done, timeouts, err := e.fill(ctx, d, g, have, step, began.Add(gz.fill-filling))
		took := time.Since(began)
		filling += took
		have = done
		if err != nil {
			if errors.Is(err, errFillBound) {
				note = fmt.Sprintf("stopped at %s %ss of the step to %s: filling the steps took longer than the bound, %v (this step at %s/s, %d calls retried after a timeout or a broken connection)",
					thousands(int64(done)), d.unit, thousands(int64(step)), gz.fill, thousands(int64(float64(done-before)/took.Seconds())), timeouts)
				e.log.Info("bench: growth: bound reached", "system", e.sys, "dimension", d.name, "reached", reached, "filled", done, "target", step)
				break
			}
			if reached == 0 || ctx.Err() != nil {
				return out, fmt.Errorf("%s: fill to %d: %w", d.name, step, err)
			}
			// A server that refuses more state (a quota, a limit) has
			// shown where it stops: the steps before stand.
			note = fmt.Sprintf("stopped at %s %ss of the step to %s: %v", thousands(int64(done)), d.unit, thousands(int64(step)), err)
			e.log.Info("bench: growth: refused", "system", e.sys, "dimension", d.name, "reached", reached, "filled", done, "target", step, "err", err)
			break
		}
		reached = step
		rss, err := settle()
		if err != nil {
			return out, err
		}
		live, err := e.liveHeap(ctx)
		if err != nil {
			return out, err
		}
		var r Result
		r.Variant = d.name + " " + thousands(int64(step))
		r.add("size", float64(step), "", Neither)
		r.add(d.name+" made/s", float64(step-before)/took.Seconds(), "/s", Higher)
		r.add("server RSS", mib(rss), "MiB", Lower)
		r.add("server live heap", mib(live), "MiB", Neither)
		r.add("fill calls retried (timeout, broken connection)", float64(timeouts), "", Neither)
		sizes = append(sizes, float64(step))
		lives = append(lives, float64(live))
		rsses = append(rsses, float64(rss))
		var p50 [2]float64
		var failed error
		for k, n := range []int{1, 64} {
			lr, err := e.ownLocksAfter(ctx, n, gz.warmup, gz.window)
			if err != nil {
				failed = fmt.Errorf("workload %d: %w", k+1, err)
				break
			}
			if f, _ := lr.figure("pairs/s"); f.Value == 0 {
				failed = fmt.Errorf("workload %d: no Lock+Unlock pair ended in the %v window", k+1, gz.window)
				break
			}
			prefix := fmt.Sprintf("(%d) ", k+1)
			for _, name := range []string{"pairs/s", "pair p50", "pair p99"} {
				f, _ := lr.figure(name)
				r.add(prefix+name, f.Value, f.Unit, f.Better)
			}
			f, _ := lr.figure("pair p50")
			p50[k] = f.Value
		}
		out = append(out, r)
		if failed != nil {
			if len(p50s[0]) == 0 || ctx.Err() != nil {
				return out, fmt.Errorf("%s %d, %w", d.name, step, failed)
			}
			// The state is there, and the server could not serve the
			// locks beside it: where the dimension ends, not a failed run.
			note = fmt.Sprintf("at %s %ss, %v", thousands(int64(step)), d.unit, failed)
			e.log.Info("bench: growth: locks failed", "system", e.sys, "dimension", d.name, "size", step, "err", failed)
			break
		}
		measured = step
		p50s[0], p50s[1] = append(p50s[0], p50[0]), append(p50s[1], p50[1])
		e.log.Info("bench: growth: step", "system", e.sys, "dimension", d.name, "size", step, "took", took.Round(time.Millisecond),
			"rss_mib", math.Round(mib(rss)), "p50_1_ms", p50[0], "p50_2_ms", p50[1])
	}

	s := Result{Variant: d.name, Note: note}
	s.add("largest step reached", float64(reached), "", Higher)
	s.add("largest step measured", float64(measured), "", Higher)
	s.add("server RSS at start", mib(rss0), "MiB", Neither)
	if len(p50s[0]) >= 2 {
		for k := range p50s {
			s.add(fmt.Sprintf("(%d) p50 growth, largest step/smallest", k+1), p50s[k][len(p50s[k])-1]/p50s[k][0], "×", Lower)
		}
	}
	if len(sizes) >= 2 {
		slope, r2 := fitLine(sizes, rsses)
		s.add("RSS per "+d.unit+" (slope)", slope, "B", Lower)
		s.add("RSS linearity", r2, "R²", Neither)
		heap, _ := fitLine(sizes, lives)
		s.add("live heap per "+d.unit+" (slope)", heap, "B", Lower)
		if d.name == "sessions" {
			const million = 1000000
			if reached == million {
				s.add("RSS at 1,000,000 sessions", rsses[len(rsses)-1]/(1<<20), "MiB", Lower)
			} else {
				// Projected from the largest step reached along the
				// fitted slope.
				s.add("RSS at 1,000,000 sessions, projected", (rsses[len(rsses)-1]+slope*(million-sizes[len(sizes)-1]))/(1<<20), "MiB", Lower)
			}
		}
	}
	return append(out, s), nil
}

// liveHeap is the server's Go heap that its last garbage collection
// found live, from its /metrics (both servers export Go's memory
// statistics): the collector's next goal over 1 + GOGC/100, at GOGC's
// default 100 on both. RSS also holds the garbage made since and memory
// not yet given back; the live heap is what the state itself keeps.
func (e *env) liveHeap(ctx context.Context) (int64, error) {
	next, err := e.srv.Metric(ctx, "go_memstats_next_gc_bytes")
	if err != nil {
		return 0, fmt.Errorf("live heap: %w", err)
	}
	return int64(next / 2), nil
}

// errFillBound is returned by fill when the dimension's bound passed
// before the step was reached.
var errFillBound = errors.New("fill bound reached")

// fill makes units have to want-1 of d's state, fillParallel at once,
// starting none after deadline, and returns how many units there are
// then (want, unless it failed or the deadline passed) and how many
// calls timed out and were tried again. It logs its progress every
// growthSizes.progress.
func (e *env) fill(ctx context.Context, d dimension, g *grower, have, want int, deadline time.Time) (int, int, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next, done, timeouts atomic.Int64
	next.Store(int64(have))
	done.Store(int64(have))
	began := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(e.sz.growth.progress)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				n := done.Load()
				u, _ := e.srv.Usage()
				e.log.Info("bench: growth: filling", "system", e.sys, "dimension", d.name, "made", n, "target", want,
					"per_s", math.Round(float64(n-int64(have))/time.Since(began).Seconds()), "rss_mib", math.Round(mib(u.RSS)), "timeouts", timeouts.Load())
			}
		}
	})
	var workers sync.WaitGroup
	for range min(fillParallel, want-have) {
		workers.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= want {
					return
				}
				if time.Now().After(deadline) {
					cancel(errFillBound)
					return
				}
				for {
					err := d.op(ctx, g, i)
					if err == nil {
						break
					}
					if ctx.Err() == nil && timedOut(err) && time.Now().Before(deadline) {
						// A server that stalls longer than the
						// client's timeout has not refused the state;
						// the stall shows in the step's figures, and
						// the call is tried again (timeouts counts them).
						timeouts.Add(1)
						continue
					}
					cancel(fmt.Errorf("%s %d: %w", d.unit, i, err))
					return
				}
				done.Add(1)
			}
		})
	}
	workers.Wait()
	close(stop)
	wg.Wait()
	n := int(done.Load())
	if err := context.Cause(ctx); err != nil {
		return n, int(timeouts.Load()), err
	}
	return n, int(timeouts.Load()), nil
}

// timedOut reports whether err is a call's own timeout (Tenure's client
// gives up on a call after 5s, ErrUnknownOutcome) or a connection that
// broke under it (a session Open whose reused keep-alive connection the
// server had closed failed with EPIPE): a call that may be repeated
// here, since a repeated put writes the same value, and a session or
// watch made twice adds one unit more than counted, which the step's
// "calls retried" figure bounds.
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrUnknownOutcome) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) ||
		connect.CodeOf(err) == connect.CodeDeadlineExceeded || connect.CodeOf(err) == connect.CodeUnavailable ||
		status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Unavailable
}

// fitLine fits y = a + b·x by least squares and returns the slope b and
// the fit's R²: how much of y's variance the line explains, 1 for
// points on a line.
func fitLine(xs, ys []float64) (slope, r2 float64) {
	n := float64(len(xs))
	var sx, sy float64
	for i := range xs {
		sx, sy = sx+xs[i], sy+ys[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy, syy float64
	for i := range xs {
		dx, dy := xs[i]-mx, ys[i]-my
		sxx, sxy, syy = sxx+dx*dx, sxy+dx*dy, syy+dy*dy
	}
	if sxx == 0 {
		return 0, 0
	}
	slope = sxy / sxx
	if syy == 0 {
		return slope, 1
	}
	return slope, sxy * sxy / (sxx * syy)
}

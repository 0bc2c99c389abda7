package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"
)

// A profiler takes Go's CPU profile, an execution trace and the
// allocation profile at both edges of every server node, and a CPU
// profile of the harness, across each measured window, from the /debug/pprof/ both
// servers serve with --enable-pprof, into Dir: the breakdowns in
// docs/benchmarks.md are read from them (go tool pprof, go tool trace).
// Profiling costs the server a few percent of CPU while it runs, so a
// run that profiles is for finding where time goes, not for the
// published figures.
type profiler struct {
	dir  string
	name string // the file names' stem: workload, system, round
	srv  *Server
	n    int // windows profiled so far: a workload may open several
	wg   sync.WaitGroup
	errs []error
	mu   sync.Mutex
}

// traceFor is how long the execution trace lasts: a trace of a busy
// server is tens of megabytes per second.
const traceFor = time.Second

// window takes a profile of each node for dur and a trace of its first
// traceFor, starting now; wait waits for them.
func (p *profiler) window(ctx context.Context, dur time.Duration) {
	secs := max(1, int(dur.Round(time.Second)/time.Second))
	p.n++
	stem := p.name
	if p.n > 1 {
		stem += fmt.Sprintf("-w%d", p.n)
	}
	p.wg.Go(func() {
		p.note(profileHarness(ctx, filepath.Join(p.dir, stem+"-harness.pprof"), dur))
	})
	for i, ep := range p.srv.Endpoints {
		node := ""
		if len(p.srv.Endpoints) > 1 {
			node = fmt.Sprintf("-node%d", i+1)
		}
		// The allocations at both edges: go tool pprof -base START END
		// shows what the window allocated.
		allocs := "http://" + ep + "/debug/pprof/allocs"
		p.note(fetchTo(ctx, allocs, filepath.Join(p.dir, stem+node+"-allocs-start.pprof")))
		p.wg.Go(func() {
			select {
			case <-time.After(dur):
			case <-ctx.Done():
				return
			}
			p.note(fetchTo(ctx, allocs, filepath.Join(p.dir, stem+node+"-allocs-end.pprof")))
		})
		for _, f := range []struct{ path, ext string }{
			{"/debug/pprof/profile?seconds=" + strconv.Itoa(secs), ".pprof"},
			{"/debug/pprof/trace?seconds=" + strconv.Itoa(int(traceFor/time.Second)), ".trace"},
		} {
			p.wg.Go(func() {
				p.note(fetchTo(ctx, "http://"+ep+f.path, filepath.Join(p.dir, stem+node+f.ext)))
			})
		}
	}
}

// note records err, if any, for wait to return.
func (p *profiler) note(err error) {
	if err == nil {
		return
	}
	p.mu.Lock()
	p.errs = append(p.errs, err)
	p.mu.Unlock()
}

func (p *profiler) wait() []error {
	p.wg.Wait()
	return p.errs
}

// profileHarness takes a CPU profile of this process, the clients (and
// delay lines), for dur: on two shared cores their CPU is the servers'
// competition, and a client's work is on every operation's path.
func profileHarness(ctx context.Context, path string, dur time.Duration) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("profile the harness: %w", err)
	}
	select {
	case <-time.After(dur):
	case <-ctx.Done():
	}
	pprof.StopCPUProfile()
	return f.Close()
}

func fetchTo(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("profile %s: %s: %s", url, resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile %s: %w", url, err)
	}
	return f.Close()
}

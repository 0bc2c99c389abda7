package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// floor is what this machine allows one commit, measured in the same run
// as the figures compared with it (issue 32): the median of a 100-byte
// write and sync on the disk the servers' data is on, and of a 100-byte
// round trip over loopback TCP between this process and another (the
// tenure binary's hidden "bench echo"), as between a client and a
// server: within one process a round trip took a fifth of that. A Lock+Unlock pair is two calls, each a
// round trip around one commit; on a cluster the commit also waits for
// a follower's write (its sync plus --sync-delay) across --peer-rtt. No
// server can answer a pair faster than twice that, so throughput is
// compared with its inverse and latency with it, not only with etcd.
type floor struct {
	sync, rtt time.Duration
}

// floorSamples is how many syncs and round trips are timed: a second or
// so on this machine.
const floorSamples = 300

// measureFloor times the disk in dir and the loopback network to an
// echo process of binary.
func measureFloor(ctx context.Context, dir, binary string) (floor, error) {
	var f floor
	var err error
	if f.sync, err = medianSync(ctx, dir); err != nil {
		return f, fmt.Errorf("time the disk's sync: %w", err)
	}
	if f.rtt, err = medianLoopbackRTT(ctx, binary); err != nil {
		return f, fmt.Errorf("time a loopback round trip: %w", err)
	}
	return f, nil
}

// commit is one call's floor on a cluster of nodes nodes of sys
// started by spec: the client's round trip and a sync (the leader's, or
// on a cluster a follower's, which the leader's own write overlaps),
// plus what spec injects: the peer round trip on a cluster, and the
// sync delay (etcd's only when it runs under a tracer that adds it).
func (f floor) commit(spec ServerSpec, sys System, nodes int) time.Duration {
	c := f.rtt + f.sync
	if sys == Tenure || spec.EtcdTracer != "" {
		c += spec.SyncDelay
	}
	if nodes > 1 {
		c += spec.PeerRTT
	}
	return c
}

// addFloor adds the commit floor and, for a pair of calls, the pair
// limit and the share of it reached at rate pairs/s.
func (r *Result) addFloor(f floor, commit time.Duration, pairsPerSec float64) {
	r.add("disk sync p50 (this run)", ms(f.sync), "ms", Neither)
	r.add("loopback round trip p50 (this run)", ms(f.rtt), "ms", Neither)
	r.add("one commit's floor", ms(commit), "ms", Neither)
	if pairsPerSec > 0 {
		limit := 1 / (2 * commit.Seconds())
		r.add("pair limit (two commits)", limit, "/s", Neither)
		r.add("of the pair limit", 100*pairsPerSec/limit, "%", Higher)
	}
}

// addClusterFloor adds, for a cluster, the commit floor at the sync its
// nodes measured in the window (syncs, read before and after it) in
// place of the disk's alone. Three nodes on one machine share one disk:
// a commit's syncs, the leader's and its followers', reach it at the
// same moment and queue, so each takes several times what a sync alone
// does; and with --sync-delay the nodes' time holds the delay as the
// runtime's sleep keeps it. The floor above (the disk alone, the
// delays as asked) is the issue's; this one tells how much of the gap
// is the machine's own.
func (r *Result) addClusterFloor(f floor, spec ServerSpec, before, after syncs, pairsPerSec float64) {
	n := after.count - before.count
	if n <= 0 {
		return
	}
	sync := time.Duration((after.seconds - before.seconds) / n * float64(time.Second))
	commit := f.rtt + spec.PeerRTT + sync
	r.add("log sync mean, all nodes", ms(sync), "ms", Neither)
	r.add("one commit's floor at the nodes' sync", ms(commit), "ms", Neither)
	if pairsPerSec > 0 {
		limit := 1 / (2 * commit.Seconds())
		r.add("of the pair limit at the nodes' sync", 100*pairsPerSec/limit, "%", Higher)
	}
}

func medianSync(ctx context.Context, dir string) (time.Duration, error) {
	file, err := os.CreateTemp(dir, "floor-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(file.Name())
	defer file.Close()
	// Preallocated and zeroed first, as a log segment is, so that the
	// syncs time data, not the file growing.
	block := make([]byte, 512)
	if _, err := file.Write(make([]byte, floorSamples*len(block))); err != nil {
		return 0, err
	}
	if err := file.Sync(); err != nil {
		return 0, err
	}
	lats := make([]time.Duration, 0, floorSamples)
	for i := range floorSamples {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		start := time.Now()
		if _, err := file.WriteAt(block[:100], int64(i*len(block))); err != nil {
			return 0, err
		}
		if err := file.Sync(); err != nil {
			return 0, err
		}
		lats = append(lats, time.Since(start))
	}
	return median(lats), nil
}

func medianLoopbackRTT(ctx context.Context, binary string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "bench", "echo")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s bench echo: %w", binary, err)
	}
	defer cmd.Wait() //nolint:errcheck // it ends when the connection does
	defer cancel()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("%s bench echo said no address: %w", binary, err)
	}
	c, err := net.Dial("tcp", strings.TrimSpace(addr))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	msg := make([]byte, 100)
	lats := make([]time.Duration, 0, floorSamples)
	for range floorSamples {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, msg); err != nil {
			return 0, err
		}
		lats = append(lats, time.Since(start))
	}
	return median(lats), nil
}

// ServeEcho is "tenure bench echo", the other end of the floor's round
// trip: it listens on a free loopback port, prints its address on w,
// echoes the first connection until it closes, and returns. It gives up
// if no connection comes within 30 seconds.
func ServeEcho(w io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	if _, err := fmt.Fprintln(w, ln.Addr().String()); err != nil {
		return err
	}
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = io.Copy(c, c)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// dataDir is where the server's data is: the floor's sync is timed on
// the same file system.
func (s *Server) dataDir() string { return filepath.Clean(s.dir) }

package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

// TestMemoryProfile is workload 8 of tenure bench (internal/bench/memory.go)
// with heap profiles: the server runs in this process, and the load in a
// child process (TestMemoryLoad), so that the profiles and the RSS are the
// server's alone. The child opens TENURE_MEMPROFILE_SESSIONS idle
// sessions (default 10,000, TTL 1 minute) over 8 clients, then has the
// first 1,000 of them take TENURE_MEMPROFILE_LOCKS locks (default
// 100,000) with unary Acquire calls. At the start and after each step the
// server's RSS is read (as the bench reads it, a second after the step),
// and then, after a GC, a heap profile and the goroutines are written
// into the directory TENURE_MEMPROFILE names. It is skipped unless that
// variable is set.
//
//	TENURE_MEMPROFILE=/tmp/mp go test -run TestMemoryProfile -v ./server
//	go tool pprof -sample_index=inuse_space -top -base /tmp/mp/sessions.pprof /tmp/mp/locks.pprof
func TestMemoryProfile(t *testing.T) {
	dir := os.Getenv("TENURE_MEMPROFILE")
	if dir == "" || os.Getenv("TENURE_MEMPROFILE_ADDR") != "" {
		t.Skip("TENURE_MEMPROFILE not set")
	}
	runtime.MemProfileRate = 4096
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.Open(server.Config{
		Listener: ln,
		Limits:   server.DefaultLimits(),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Raft:     raftnode.Config{NodeID: "node1", DataDir: t.TempDir(), PeerAddr: "127.0.0.1:0", Bootstrap: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr := srv.Addr()
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var rss []float64
	snap := func(name string) {
		time.Sleep(time.Second)
		rss = append(rss, mb(procStatus(t, "VmRSS:")))
		t.Logf("%s: RSS anonymous %.1f MiB, file-backed (the binary's pages) %.1f MiB", name, mb(procStatus(t, "RssAnon:")), mb(procStatus(t, "RssFile:")))
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		t.Logf("%s: RSS %.1f MiB; after GC: heap inuse %.1f MiB, heap alloc %.1f MiB, heap idle not released %.1f MiB, stacks %.1f MiB, GC metadata %.1f MiB, other %.1f MiB, sys %.1f MiB, goroutines %d",
			name, rss[len(rss)-1], mb(ms.HeapInuse), mb(ms.HeapAlloc), mb(ms.HeapIdle-ms.HeapReleased), mb(ms.StackInuse), mb(ms.GCSys), mb(ms.OtherSys), mb(ms.Sys), runtime.NumGoroutine())
		f, err := os.Create(filepath.Join(dir, name+".pprof"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			t.Fatal(err)
		}
		g, err := os.Create(filepath.Join(dir, name+".goroutines.txt"))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		pprof.Lookup("goroutine").WriteTo(g, 1)
	}
	snap("start")

	cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryLoad$", "-test.v")
	cmd.Env = append(os.Environ(), "TENURE_MEMPROFILE_ADDR="+addr, "GODEBUG=") // gctrace for the server only
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		switch strings.TrimSpace(line) {
		case "STEP sessions", "STEP locks":
			name := strings.TrimPrefix(strings.TrimSpace(line), "STEP ")
			snap(name)
			fmt.Fprintln(stdin, "go")
		default:
			t.Log("load: " + line)
		}
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(rss) == 3 {
		t.Logf("RSS per 10,000 idle sessions %.1f MiB, per 100,000 held locks %.1f MiB (scaled to the counts)",
			(rss[1]-rss[0])*10000/float64(envInt("TENURE_MEMPROFILE_SESSIONS", 10000)),
			(rss[2]-rss[1])*100000/float64(envInt("TENURE_MEMPROFILE_LOCKS", 100000)))
	}
}

// TestMemoryLoad is TestMemoryProfile's child: the load.
func TestMemoryLoad(t *testing.T) {
	addr := os.Getenv("TENURE_MEMPROFILE_ADDR")
	if addr == "" {
		t.Skip("run by TestMemoryProfile")
	}
	nSessions := envInt("TENURE_MEMPROFILE_SESSIONS", 10000)
	nLocks := envInt("TENURE_MEMPROFILE_LOCKS", 100000)
	in := bufio.NewScanner(os.Stdin)
	step := func(name string) {
		fmt.Println("STEP " + name)
		in.Scan()
	}
	ctx := context.Background()
	clients := make([]*client.Client, 8)
	for i := range clients {
		c, err := client.New(ctx, []string{addr}, client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	sessions := make([]*client.Session, nSessions)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= nSessions {
					return
				}
				s, err := clients[i%len(clients)].NewSession(ctx, client.WithTTL(time.Minute))
				if err != nil {
					t.Error(err)
					return
				}
				sessions[i] = s
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	step("sessions")

	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	leases := tenurev1connect.NewLeaseServiceClient(&http.Client{Transport: tr}, "http://"+addr)
	holders := sessions[:min(1000, len(sessions))]
	next.Store(0)
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= nLocks {
					return
				}
				s := holders[i%len(holders)]
				resp, err := leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{
					SessionId: s.ID(), Namespace: client.DefaultNamespace, Name: "held-" + strconv.Itoa(i), Capacity: 1,
				}))
				if err != nil {
					t.Error(err)
					return
				}
				if !resp.Msg.GetAcquired() {
					t.Errorf("lock %d not acquired", i)
					return
				}
			}
		})
	}
	wg.Wait()
	step("locks")
}

// procStatus reads a field of /proc/self/status in kB, as bytes.
func procStatus(t *testing.T, field string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no " + field)
	return 0
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func mb(n uint64) float64 { return float64(n) / (1 << 20) }

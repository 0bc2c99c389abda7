package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/proccluster"
	"github.com/tenurehq/tenure/internal/testnet"
)

// --- the server process ---

// serverProc is one tenure server run as a child process on fixed
// 127.0.0.1 ports and data dir, so that it can be killed and restarted as
// the same node. Everything runs on the test goroutine.
type serverProc struct {
	t                     *testing.T
	bin, dataDir, logPath string
	listen, peer, url     string
	starts                int
	// args are added to every start's command line; a later flag of the
	// same name wins.
	args []string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait has returned
	api    *apiClients   // clients for the current process
}

func newServerProc(t *testing.T, bin string) *serverProc {
	dir := t.TempDir()
	p := &serverProc{
		t:       t,
		bin:     bin,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "server.log"),
		listen:  freePort(t),
		peer:    freePort(t),
	}
	p.url = "http://" + p.listen
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("server log (last lines of %s):\n%s", p.logPath, proccluster.Tail(p.logPath, 40))
		}
	})
	return p
}

// freePort returns a 127.0.0.1 address that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	return testnet.Free(t)
}

// start runs the server and returns once /readyz answers 200.
func (p *serverProc) start(ctx context.Context) {
	t := p.t
	t.Helper()
	p.starts++
	for attempt := 1; ; attempt++ {
		err := p.launch(ctx)
		if err == nil {
			break
		}
		// A port that was free when the test picked it can be taken by
		// another test's process before this one binds it. A first start
		// picks new ones (and starts over on an empty data dir, since
		// the node's ID comes from its peer address); a restart keeps
		// its addresses, which are its identity.
		if p.starts == 1 && attempt < 4 && errors.Is(err, errExited) && strings.Contains(p.lastStartLog(), "address already in use") {
			t.Logf("server start %d: a port was taken before it bound it; trying new ports", p.starts)
			p.listen, p.peer = freePort(t), freePort(t)
			p.url = "http://" + p.listen
			if err := os.RemoveAll(p.dataDir); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Fatalf("server start %d: %v", p.starts, err)
	}
	p.api = dialAPI(p.url)
}

// errExited is a server that exited before it was ready.
var errExited = errors.New("exited before ready")

// launch starts the server process and waits until it is ready.
func (p *serverProc) launch(ctx context.Context) error {
	t := p.t
	t.Helper()
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "=== start %d\n", p.starts)
	// A low snapshot threshold makes restarts restore snapshots and replay
	// the log after them, not only replay.
	args := append([]string{"serve", "--listen", p.listen, "--peer-listen", p.peer, "--data-dir", p.dataDir,
		"--snapshot-threshold", "256"}, p.args...)
	cmd := exec.Command(p.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	setDeathSignal(cmd)
	err = cmd.Start()
	f.Close() // the child has its own descriptor
	if err != nil {
		t.Fatalf("start %s: %v", p.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	return p.waitReady(ctx)
}

// lastStartLog is the server's log since its last "=== start" line.
func (p *serverProc) lastStartLog() string {
	b, _ := os.ReadFile(p.logPath)
	s := string(b)
	if i := strings.LastIndex(s, "=== start"); i >= 0 {
		s = s[i:]
	}
	return s
}

func (p *serverProc) waitReady(ctx context.Context) error {
	hc := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	begin := time.Now()
	for {
		resp, err := hc.Get(p.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w: %v", errExited, p.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v", time.Since(begin).Round(time.Millisecond))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone. It is safe to
// call when nothing runs.
func (p *serverProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
	if p.api != nil {
		p.api.close()
		p.api = nil
	}
}

// apiClients speak cleartext HTTP/2 to one server process.
type apiClients struct {
	tr       *http.Transport
	sessions tenurev1connect.SessionServiceClient
	leases   tenurev1connect.LeaseServiceClient
	kv       tenurev1connect.KVServiceClient
}

func dialAPI(url string) *apiClients {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols:   &protos,
		DialContext: (&net.Dialer{Timeout: time.Second}).DialContext,
	}
	hc := &http.Client{Transport: tr}
	return &apiClients{
		tr:       tr,
		sessions: tenurev1connect.NewSessionServiceClient(hc, url),
		leases:   tenurev1connect.NewLeaseServiceClient(hc, url),
		kv:       tenurev1connect.NewKVServiceClient(hc, url),
	}
}

func (a *apiClients) close() { a.tr.CloseIdleConnections() }

// call runs one call with the per-call timeout.
func call[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return fn(ctx)
}

// read runs a read after a restart, retrying while the server says it is
// unavailable. Reads change nothing, so retrying them is always safe.
func read[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	for {
		v, err := call(ctx, fn)
		if err == nil || connect.CodeOf(err) != connect.CodeUnavailable || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// verdict reports whether err is the server's answer rather than a lost
// connection or a timeout: the call reached the state machine or the
// handler and was rejected, so it changed nothing.
func verdict(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeAlreadyExists,
		connect.CodePermissionDenied, connect.CodeFailedPrecondition, connect.CodeResourceExhausted,
		connect.CodeOutOfRange, connect.CodeUnimplemented, connect.CodeUnauthenticated:
		return true
	}
	return false
}

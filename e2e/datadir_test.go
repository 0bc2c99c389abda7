//go:build linux

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// A second `tenure serve` on a data dir in use must not wait, silent and
// deaf to signals, on the log store's file lock: it exits at once naming
// the directory and the pid of the node using it, before binding a port,
// and the first node keeps serving. The LOCK file a killed node leaves
// behind does not stop it from starting again.
func TestASecondServeOnADataDirInUseExitsAtOnce(t *testing.T) {
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newServerProc(t, bin)
	p.start(ctx)
	if err := putKey(ctx, p, 0, "first"); err != nil {
		t.Fatalf("put on the first node: %v", err)
	}

	listen := freePort(t)
	second, cancelSecond := context.WithTimeout(ctx, 20*time.Second)
	defer cancelSecond()
	cmd := exec.CommandContext(second, bin, "serve", "--listen", listen, "--peer-listen", freePort(t), "--data-dir", p.dataDir)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	setDeathSignal(cmd)
	err := cmd.Run()
	if second.Err() != nil {
		t.Fatalf("got = the second serve still running after 20s (%s), expected: it exits at once", stderr.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("got = %v (%s), expected: exit code 1", err, stderr.String())
	}
	want := fmt.Sprintf("data dir %s is in use by another tenure (pid %d)", p.dataDir, p.cmd.Process.Pid)
	if !strings.Contains(stderr.String(), want) {
		t.Fatalf("got = %q, expected: %q", stderr.String(), want)
	}
	if strings.Contains(stderr.String(), "tenure serving") {
		t.Fatalf("got = %q, expected: no port bound, nothing served", stderr.String())
	}

	if err := putKey(ctx, p, 1, "first"); err != nil {
		t.Fatalf("put on the first node after the second gave up: %v", err)
	}

	p.kill()
	lockFile := filepath.Join(p.dataDir, "LOCK")
	if b, err := os.ReadFile(lockFile); err != nil || len(bytes.TrimSpace(b)) == 0 {
		t.Fatalf("got = LOCK %q (%v) after kill -9, expected: the killed node's pid left behind", b, err)
	}
	p.start(ctx) // fails the test if the stale LOCK file blocks it
	if b, _ := os.ReadFile(lockFile); strings.TrimSpace(string(b)) != strconv.Itoa(p.cmd.Process.Pid) {
		t.Fatalf("got = LOCK %q, expected: the restarted node's pid %d", b, p.cmd.Process.Pid)
	}
	got, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
		return p.api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "k0001"}))
	})
	if err != nil || got.Msg.GetKv().GetValue() != "first" {
		t.Fatalf("read after the restart: got = %v, expected: k0001 kept", err)
	}
}

// A start that waits (here on the log store's meta file, locked by
// something else than a tenure) still ends on SIGTERM.
func TestServeHonoursSIGTERMWhileStarting(t *testing.T) {
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newServerProc(t, bin)
	p.start(ctx)
	p.kill()

	meta, err := os.OpenFile(filepath.Join(p.dataDir, "raft", "wal", "wal-meta.db"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	if err := syscall.Flock(int(meta.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("lock the log's meta file: %v", err)
	}

	cmd := exec.Command(bin, "serve", "--listen", p.listen, "--peer-listen", p.peer, "--data-dir", p.dataDir)
	var stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	gone := make(chan struct{})
	go func() {
		exited <- cmd.Wait()
		close(gone)
	}()
	defer func() {
		_ = cmd.Process.Kill()
		<-gone
	}()
	// The API port is bound before the log opens: once it takes
	// connections, the start is waiting on the meta file.
	eventually(t, 20*time.Second, "serve to bind its API port", func() bool {
		c, err := net.DialTimeout("tcp", p.listen, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	select {
	case err := <-exited:
		t.Fatalf("got = serve exited (%v: %s), expected: waiting on the locked meta file", err, stderr.String())
	case <-time.After(500 * time.Millisecond):
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "interrupted by a signal while starting") {
			t.Fatalf("got = %v (%s), expected: exit code 1, interrupted while starting", err, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("got = serve still running 15s after SIGTERM (%s), expected: it exits", stderr.String())
	}
}

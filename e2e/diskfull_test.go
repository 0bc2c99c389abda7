package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// mountSmallFS mounts a tmpfs of the given size for the test, or skips
// the test where that needs privileges the machine does not give.
func mountSmallFS(t *testing.T, size string) string {
	t.Helper()
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("needs root on Linux to mount a small tmpfs")
	}
	mnt := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	// huge=never: a tmpfs that backs files with 2 MiB pages may keep a
	// truncated file's last page whole, and round every small file up to
	// 2 MiB, so the free space the tests leave would not be what they
	// measured. Kernels without huge page support refuse the option.
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",huge=never", "tmpfs", mnt).CombinedOutput()
	if err != nil {
		out, err = exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", mnt).CombinedOutput()
	}
	if err != nil {
		t.Skipf("cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

// fillDisk writes a file into dir until the file system is full, then
// shrinks it so that about leave bytes are free. The caller removes it to
// free the space.
func fillDisk(t *testing.T, dir string, leave int64) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 256<<10)
	for i := range chunk {
		chunk[i] = 1
	}
	var size int64
	for {
		n, err := f.Write(chunk)
		size += int64(n)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(max(size-leave, 0)); err != nil {
		t.Fatal(err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	t.Logf("filled %s: %d bytes free, %d wanted", dir, free, leave)
	if free < leave/2 {
		t.Fatalf("got = %d bytes free after freeing %d, expected: about %d (the file system did not give the space back)", free, leave, leave)
	}
	return path
}

func httpStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// eventually polls cond every 50ms for up to limit.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A 30 MiB file system cannot hold raft-wal's default 64 MiB segment: the
// server must say so, and name the flag that fixes it, instead of
// failing obscurely.
func TestServeOnASmallDiskNamesTheSegmentSize(t *testing.T) {
	bin := tenureBinary(t)
	mnt := mountSmallFS(t, "30m")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--listen", freePort(t), "--peer-listen", freePort(t),
		"--data-dir", filepath.Join(mnt, "data")).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("got = serve ran (%v), expected: it exits at once on a 30 MiB disk\n%s", err, out)
	}
	if !strings.Contains(string(out), "disk full") || !strings.Contains(string(out), "--wal-segment-size") {
		t.Fatalf("got = %s\nexpected: a disk-full error naming --wal-segment-size", out)
	}

	// With small segments the same disk serves.
	p := newServerProc(t, bin)
	p.dataDir = filepath.Join(mnt, "data")
	p.args = []string{"--wal-segment-size", "1MiB"}
	p.start(ctx)
	if _, err := p.api.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "k", Value: "v"})); err != nil {
		t.Fatalf("put on a small disk with 1MiB segments: %v", err)
	}
}

// When the disk runs below the reserve, writes that add state fail with
// resource_exhausted naming the disk, reads keep working, /healthz says
// why, and everything resumes by itself once space is freed — nothing
// acknowledged is lost.
func TestFullDiskRefusesWritesServesReadsAndRecovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mnt, p := serveOnSmallDisk(t, ctx, "40m", "--wal-segment-size", "1MiB", "--min-free-space", "4MiB")

	value := strings.Repeat("x", 32<<10)
	acked := 0
	put := func(i int) error { return putKey(ctx, p, i, value) }
	for ; acked < 20; acked++ {
		if err := put(acked); err != nil {
			t.Fatalf("put %d with room: %v", acked, err)
		}
	}

	filler := fillDisk(t, mnt, 2<<20) // below the 4 MiB reserve
	eventually(t, 10*time.Second, "/healthz to report the full disk", func() bool {
		code, _ := httpStatus(t, p.url+"/healthz")
		return code == http.StatusServiceUnavailable
	})
	if _, body := httpStatus(t, p.url+"/healthz"); !strings.Contains(body, "disk full") || !strings.Contains(body, mnt) {
		t.Fatalf("got = /healthz %q, expected: the full disk named", body)
	}
	err := put(acked)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("got = %v, expected: resource_exhausted naming the disk", err)
	}
	got, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
		return p.api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "k0019"}))
	})
	if err != nil || got.Msg.GetKv().GetValue() != value {
		t.Fatalf("read on a full disk: got = %v, expected: the value", err)
	}
	if code, _ := httpStatus(t, p.url+"/readyz"); code != http.StatusOK {
		t.Fatalf("got = /readyz %d on a full disk, expected: 200", code)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "writes to resume", func() bool { return put(acked) == nil })
	acked++
	verifyAcked(t, ctx, p, acked, value)
}

// With the reserve turned off the log itself runs out of space. raft-wal
// wedges then (every append "segment is sealed" until a restart); the
// node must instead reopen its log by itself once space is freed, and
// lose nothing acknowledged.
func TestFullDiskWithoutReserveRecoversWithoutRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	mnt, p := serveOnSmallDisk(t, ctx, "40m", "--wal-segment-size", "1MiB", "--min-free-space", "0")

	value := strings.Repeat("y", 32<<10)
	put := func(i int) error { return putKey(ctx, p, i, value) }
	filler := fillDisk(t, mnt, 3<<20)
	acked := 0
	var failed error
	for ; acked < 500; acked++ {
		if failed = put(acked); failed != nil {
			break
		}
	}
	if failed == nil {
		t.Fatalf("500 puts of 32 KiB fit in 3 MiB: the disk never filled")
	}
	if code := connect.CodeOf(failed); code != connect.CodeResourceExhausted && code != connect.CodeUnavailable {
		t.Fatalf("got = %v (%v) when the disk filled, expected: resource_exhausted (or unavailable while the leader steps down)", failed, code)
	}
	t.Logf("the disk filled after %d puts: %v", acked, failed)
	// The log cannot be written, so no node leads: every call that needs
	// the leader, reads included, names the full disk rather than say
	// that no leader is known yet.
	for i := range 3 {
		err := put(acked)
		_, rerr := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
			return p.api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "k0000"}))
		})
		for _, err := range []error{err, rerr} {
			if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "disk full") {
				t.Fatalf("call %d on a full disk: got = %v, expected: resource_exhausted naming the full disk", i, err)
			}
		}
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// The failed put's outcome is unknown to this client; retry it until
	// it lands, which proves writes resumed without a restart.
	eventually(t, 20*time.Second, "writes to resume without a restart", func() bool { return put(acked) == nil })
	acked++
	verifyAcked(t, ctx, p, acked, value)
}

// serveOnSmallDisk starts a server whose data dir is on a tmpfs of the
// given size, with the given serve flags.
func serveOnSmallDisk(t *testing.T, ctx context.Context, size string, args ...string) (mnt string, p *serverProc) {
	t.Helper()
	bin := tenureBinary(t)
	mnt = mountSmallFS(t, size)
	p = newServerProc(t, bin)
	p.dataDir = filepath.Join(mnt, "data")
	p.args = args
	p.start(ctx)
	return mnt, p
}

// putKey writes value to key k<i>.
func putKey(ctx context.Context, p *serverProc, i int, value string) error {
	_, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.PutResponse], error) {
		return p.api.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: fmt.Sprintf("k%04d", i), Value: value}))
	})
	return err
}

// verifyAcked reads back keys k0000..k(n-1), then again after a kill -9
// and restart.
func verifyAcked(t *testing.T, ctx context.Context, p *serverProc, n int, value string) {
	t.Helper()
	check := func(when string) {
		for i := range n {
			key := fmt.Sprintf("k%04d", i)
			got, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
				return p.api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: key}))
			})
			if err != nil || got.Msg.GetKv().GetValue() != value {
				t.Fatalf("%s: acknowledged %s: got = %v, expected: its value", when, key, err)
			}
		}
	}
	check("before restart")
	p.kill()
	p.start(ctx)
	check("after kill -9 and restart")
}

// A burst of writers fills log segments far faster than free space was
// measured (once a second), and each new segment takes its whole size at
// once: the reserve must still hold. Every refused write names the disk,
// reads keep answering, and once space is freed the node takes writes
// again without a restart, with everything acknowledged kept.
func TestABurstOfWritesCannotOutrunTheReserve(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// 1 MiB segments and the default reserve, two of them.
	mnt, p := serveOnSmallDisk(t, ctx, "40m", "--wal-segment-size", "1MiB", "--snapshot-threshold", "100000")
	pid := p.cmd.Process.Pid
	// The node leads and has written before the disk fills.
	eventually(t, 20*time.Second, "a first write", func() bool { return putKey(ctx, p, 9998, "first") == nil })
	filler := fillDisk(t, mnt, 8<<20) // room for a few segments, then the reserve
	// A write made while the filler still took every byte (one of the
	// node's own just after its election, by the log's times) finds the
	// disk full,
	// and the node refuses writes until its next measure, within a
	// second (watchSpace): in one run every put of the burst came in that
	// second, all refused with 860 KiB free while the disk listed 8 MiB
	// free. The burst starts once the node takes writes again.
	eventually(t, 10*time.Second, "a write after the fill", func() bool { return putKey(ctx, p, 9997, "second") == nil })

	const writers = 8
	value := strings.Repeat("b", 32<<10)
	type outcome struct {
		acked   []int
		refused []error
	}
	results := make(chan outcome, writers)
	for w := range writers {
		go func() {
			var o outcome
			// Each writer goes on past its first refusal, as a client
			// retrying would.
			for i := w * 1000; i < (w+1)*1000 && len(o.refused) < 5 && ctx.Err() == nil; i++ {
				if err := putKey(ctx, p, i, value); err != nil {
					o.refused = append(o.refused, err)
				} else {
					o.acked = append(o.acked, i)
				}
			}
			results <- o
		}()
	}
	var acked []int
	refused := 0
	var firstRefusal error
	for range writers {
		o := <-results
		acked = append(acked, o.acked...)
		for _, err := range o.refused {
			refused++
			if firstRefusal == nil {
				firstRefusal = err
			}
			if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "disk full") {
				t.Errorf("got = %v, expected: every refusal resource_exhausted naming the full disk", err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if refused == 0 {
		t.Fatalf("got = %d puts of 32 KiB all taken with 8 MiB free, expected: refusals once the reserve is reached", len(acked))
	}
	t.Logf("%d writers: %d puts acknowledged, %d refused", writers, len(acked), refused)
	if len(acked) == 0 {
		out, _ := exec.Command("du", "-a", "-k", mnt).CombinedOutput()
		t.Fatalf("got = every put refused (first: %v), expected: puts taken until the reserve is reached; the disk (du -k):\n%s", firstRefusal, out)
	}

	got, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
		return p.api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: fmt.Sprintf("k%04d", acked[0])}))
	})
	if err != nil || got.Msg.GetKv().GetValue() != value {
		t.Fatalf("read on a full disk: got = %v, expected: the value", err)
	}
	if code, body := httpStatus(t, p.url+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "disk full") {
		t.Fatalf("got = /healthz %d %q, expected: 503 naming the full disk", code, body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "writes to resume", func() bool { return putKey(ctx, p, 9999, value) == nil })
	if p.cmd.Process.Pid != pid || p.starts != 1 {
		t.Fatalf("got = the server restarted, expected: writes resumed in the same process")
	}
	for _, i := range append(acked, 9999) {
		key := fmt.Sprintf("k%04d", i)
		got, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
			return p.api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: key}))
		})
		if err != nil || got.Msg.GetKv().GetValue() != value {
			t.Fatalf("acknowledged %s: got = %v, expected: its value", key, err)
		}
	}
}

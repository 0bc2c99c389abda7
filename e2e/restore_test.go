package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/proccluster"
)

// TestRestoreOntoNewAddresses copies a stopped node's data dir, as an
// operator restoring a backup would, and starts the copy with another
// --peer-listen, hence another node ID. That start used to come up and
// stay unready forever, with nothing in the log to say why. Now it must
// fail at once with an error that says what to do, and the restore it
// names, --force-new-cluster, must bring the copy up as a single-node
// cluster at the new address with every key and grant, taking new writes.
func TestRestoreOntoNewAddresses(t *testing.T) {
	t.Parallel() // its own processes, mostly waiting: it runs beside the package's other slow tests
	if testing.Short() {
		t.Skip("builds the server and runs it three times")
	}
	bin := tenureBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	orig := newServerProc(t, bin)
	orig.start(ctx)
	put, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.PutResponse], error) {
		return orig.api.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "restore/k", Value: "before"}))
	})
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	sess, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.OpenSessionResponse], error) {
		return orig.api.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Identity: "restore-holder", Ttl: durationpb.New(10 * time.Minute)}))
	})
	if err != nil {
		t.Fatalf("open session: %v", err)
	}
	grant, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.AcquireResponse], error) {
		return orig.api.leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: sess.Msg.Session.Id, Name: "restore-lock"}))
	})
	if err != nil || !grant.Msg.Acquired {
		t.Fatalf("acquire: got = %v %v, expected: granted", grant, err)
	}
	orig.stop()

	restored := newServerProc(t, bin) // new --listen, --peer-listen and data dir
	if err := os.CopyFS(restored.dataDir, os.DirFS(orig.dataDir)); err != nil {
		t.Fatalf("copy the data dir: %v", err)
	}

	// Started as it is, the copy must refuse at once and say what to do.
	began := time.Now()
	code, stderr := restored.runToExit(ctx, 15*time.Second)
	took := time.Since(began)
	if code == 0 {
		t.Fatalf("copy started on a new --peer-listen: exit code got = 0, expected: non-zero\nstderr:\n%s", stderr)
	}
	if took > 10*time.Second {
		t.Errorf("copy started on a new --peer-listen: failed after %v, expected: at once", took.Round(time.Millisecond))
	}
	for _, s := range []string{
		restored.dataDir,
		orig.peer + "@" + orig.peer,         // the stored configuration
		restored.peer + "@" + restored.peer, // this node
		"--node-id " + orig.peer + " --peer-listen " + orig.peer,
		"--force-new-cluster",
	} {
		if !strings.Contains(stderr, s) {
			t.Errorf("stderr got = %q, expected it to contain %q", stderr, s)
		}
	}

	// The restore: one start with --force-new-cluster.
	restored.startWith(ctx, "--force-new-cluster")
	checkRestored(t, ctx, restored, put.Msg.Revision, grant.Msg.Token)
	if log := proccluster.Tail(restored.logPath, 40); !strings.Contains(log, "FORCE NEW CLUSTER") {
		t.Errorf("server log has no force-new-cluster warning:\n%s", log)
	}
	after, err := call(ctx, func(ctx context.Context) (*connect.Response[tenurev1.PutResponse], error) {
		return restored.api.kv.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "restore/k", Value: "after"}))
	})
	// Keys have a clock of their own: the write comes after the key's
	// last one, as the grant's token came after every earlier event.
	if err != nil || after.Msg.Revision <= put.Msg.Revision {
		t.Fatalf("write after the restore: got = %v %v, expected: a revision above %d", after, err, put.Msg.Revision)
	}

	// Later starts are ordinary ones, without the flag.
	restored.stop()
	restored.start(ctx)
	checkRestored(t, ctx, restored, after.Msg.Revision, grant.Msg.Token)
}

// checkRestored checks that srv serves the restored data as the only
// member of its cluster, at its own peer address.
func checkRestored(t *testing.T, ctx context.Context, srv *serverProc, keyRev, token int64) {
	t.Helper()
	kv, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.GetResponse], error) {
		return srv.api.kv.Get(ctx, connect.NewRequest(&tenurev1.GetRequest{Key: "restore/k"}))
	})
	if err != nil || kv.Msg.Kv.GetModRevision() != keyRev {
		t.Errorf("get restore/k: got = %v %v, expected: the value written at revision %d", kv, err, keyRev)
	}
	v, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.ValidateResponse], error) {
		return srv.api.leases.Validate(ctx, connect.NewRequest(&tenurev1.ValidateRequest{Name: "restore-lock", Token: token}))
	})
	if err != nil || !v.Msg.Valid || v.Msg.HolderIdentity != "restore-holder" {
		t.Errorf("validate restore-lock token %d: got = %v %v, expected: valid, held by restore-holder", token, v, err)
	}
	clusterSvc := tenurev1connect.NewClusterServiceClient(&http.Client{Transport: srv.api.tr}, srv.url)
	ms, err := read(ctx, func(ctx context.Context) (*connect.Response[tenurev1.MembersResponse], error) {
		return clusterSvc.Members(ctx, connect.NewRequest(&tenurev1.MembersRequest{}))
	})
	if err != nil {
		t.Fatalf("members: %v", err)
	}
	got := ms.Msg.Members
	if len(got) != 1 || got[0].PeerAddress != srv.peer || !got[0].Voter || !got[0].Leader || !got[0].Self {
		t.Errorf("members got = %v, expected: only this node, the leader, at %s", got, srv.peer)
	}
}

// runToExit runs the server with no extra flags and returns its exit code
// and stderr, killing it if it is still running after timeout.
func (p *serverProc) runToExit(ctx context.Context, timeout time.Duration) (int, string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.bin, "serve", "--listen", p.listen, "--peer-listen", p.peer, "--data-dir", p.dataDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	setDeathSignal(cmd)
	err := cmd.Run()
	if ctx.Err() != nil {
		p.t.Fatalf("server still running after %v, expected: it exits at once\nstderr:\n%s", timeout, stderr.String())
	}
	if err != nil && cmd.ProcessState == nil {
		p.t.Fatalf("run %s: %v", p.bin, err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

// startWith is start with extra flags (replacing any from an earlier
// start).
func (p *serverProc) startWith(ctx context.Context, extra ...string) {
	p.t.Helper()
	p.args = extra
	p.start(ctx)
}

// stop shuts the server down with SIGTERM, as an operator stops a node
// before copying its data dir, and waits for it to exit.
func (p *serverProc) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.t.Fatal("server did not exit within 10s of SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		p.t.Errorf("server exit code after SIGTERM got = %d, expected: 0", code)
	}
	p.cmd = nil
	p.api.close()
	p.api = nil
}

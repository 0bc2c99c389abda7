package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/mirror"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenurehq/tenure/internal/certs"
)

// errMirrorCompacted is returned when the source compacted the
// revisions the mirror still had to read: its copy can no longer be
// brought up to date, only made again.
var errMirrorCompacted = errors.New("the source compacted revisions the mirror had not read yet; run the mirror again to start from a fresh copy")

// NewEtcdCommand builds `tenure etcd`, the commands for moving from etcd.
func NewEtcdCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "etcd",
		Short:   "Move from etcd: mirror a running etcd's keys into Tenure",
		Example: `  tenure etcd mirror --from 10.0.0.1:2379 --to 127.0.0.1:2379 --prefix /app/`,
	}
	cmd.AddCommand(newEtcdMirrorCommand(g))
	return cmd
}

type mirrorOptions struct {
	from, to                               string
	prefix, destPrefix                     string
	noDestPrefix                           bool
	cacert, cert, key, user, password      string // the source's, as etcdctl names them
	dcacert, dcert, dkey, duser, dpassword string // the destination's, as make-mirror names them
	maxTxnOps                              int
	progress                               time.Duration
}

func newEtcdMirrorCommand(g *globals) *cobra.Command {
	o := mirrorOptions{}
	cmd := &cobra.Command{
		Use:   "mirror --from ENDPOINTS --to ENDPOINTS [--prefix P]",
		Short: "Copy keys from a running etcd into Tenure's etcd API, and keep copying their changes",
		Long: `Copy the keys under --prefix from a running etcd (--from) into a Tenure
cluster's etcd API (--to, the addresses of tenure serve --etcd-listen), then
follow the source's changes and apply them, as etcdctl make-mirror does: a
consistent copy of the prefix at one revision, then the source's watch from
the next revision on, each source revision applied as one transaction. It runs
until interrupted, printing how many keys it has copied (puts and deletes, as
make-mirror counts them) and the source revision it has reached.

Keys are written without their lease, as make-mirror writes them: a key bound
to a lease in the source is a plain key in the copy, and it is deleted from the
copy when the source deletes it (its lease expired or was revoked) only while
the mirror runs. Versions and create/mod revisions are the destination's own.
If the source compacts revisions the mirror has not read yet, it stops with an
error; run it again.

--to has no default: a mirror writes, and into its own source it would copy its
own writes for ever, so it refuses a destination that is the source's cluster
when the two prefixes overlap. Works with any etcd v3 API as the destination.`,
		Example: `  # Copy /app/ from etcd into Tenure, then keep it in step until Ctrl-C
  tenure etcd mirror --from 10.0.0.1:2379,10.0.0.2:2379 --to 127.0.0.1:2379 --prefix /app/

  # The same keys under another prefix in Tenure, from a TLS etcd with auth
  tenure etcd mirror --from https://etcd:2379 --cacert ca.pem --user root:secret \
    --to tenure-1:2379 --prefix /app/ --dest-prefix /migrated/app/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runEtcdMirror(cmd.Context(), cmd.OutOrStdout(), g.timeout, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "comma-separated endpoints of the source etcd (required)")
	f.StringVar(&o.to, "to", "", "comma-separated endpoints of the destination's etcd API: tenure serve --etcd-listen (required)")
	f.StringVar(&o.prefix, "prefix", "", "key prefix to mirror (default: every key)")
	f.StringVar(&o.destPrefix, "dest-prefix", "", "write the keys under this prefix instead of --prefix")
	f.BoolVar(&o.noDestPrefix, "no-dest-prefix", false, "write the keys with --prefix taken off")
	f.StringVar(&o.cacert, "cacert", "", "the source: verify its certificate with this PEM CA bundle")
	f.StringVar(&o.cert, "cert", "", "the source: client certificate, PEM")
	f.StringVar(&o.key, "key", "", "the source: the PEM private key of --cert")
	f.StringVar(&o.user, "user", "", "the source: user name, or name:password")
	f.StringVar(&o.password, "password", "", "the source: password of --user")
	f.StringVar(&o.dcacert, "dest-cacert", "", "the destination: verify its certificate with this PEM CA bundle")
	f.StringVar(&o.dcert, "dest-cert", "", "the destination: client certificate, PEM")
	f.StringVar(&o.dkey, "dest-key", "", "the destination: the PEM private key of --dest-cert")
	f.StringVar(&o.duser, "dest-user", "", "the destination: etcd user name, or name:password")
	f.StringVar(&o.dpassword, "dest-password", "", "the destination: password of --dest-user")
	f.IntVar(&o.maxTxnOps, "max-txn-ops", 128, "most operations in one destination transaction (etcd's default limit); a source revision with more changes is applied in several")
	f.DurationVar(&o.progress, "progress", 30*time.Second, "print progress this often (0: only after the copy and at the end)")
	return cmd
}

// mirrorEnd is one side of a mirror, dialled.
type mirrorEnd struct {
	name string // "source" or "destination", for errors
	c    *clientv3.Client
}

func dialMirrorEnd(ctx context.Context, name, flag, endpoints, cacert, cert, key, user, password string, timeout time.Duration) (*mirrorEnd, error) {
	var eps []string
	for e := range strings.SplitSeq(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, usage("%s is required: the %s's endpoints, host:port or URLs, comma-separated", flag, name)
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: timeout, Logger: zap.NewNop(), Context: ctx}
	if cacert != "" || cert != "" || key != "" {
		tc, err := certs.ClientConfig(cacert, cert, key)
		if err != nil {
			return nil, usage("the %s: %v", name, err)
		}
		cfg.TLS = tc
	}
	if user != "" {
		cfg.Username = user
		if password == "" {
			var ok bool
			if cfg.Username, cfg.Password, ok = strings.Cut(user, ":"); !ok {
				return nil, usage("the %s's user %q has no password: give name:password, or the password flag", name, user)
			}
		} else {
			cfg.Password = password
		}
	} else if password != "" {
		return nil, usage("the %s has a password but no user", name)
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, &exitError{code: ExitUnreachable, err: fmt.Errorf("reach the %s at %s: %w", name, strings.Join(eps, ","), err)}
	}
	return &mirrorEnd{name: name, c: c}, nil
}

func runEtcdMirror(ctx context.Context, out io.Writer, timeout time.Duration, o mirrorOptions) error {
	if o.noDestPrefix && o.destPrefix != "" {
		return usage("--dest-prefix and --no-dest-prefix cannot be set at the same time, choose one")
	}
	if o.maxTxnOps < 1 {
		return usage("--max-txn-ops %d must be at least 1", o.maxTxnOps)
	}
	if o.progress < 0 {
		return usage("--progress %v must not be negative", o.progress)
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	dest := o.prefix
	switch {
	case o.noDestPrefix:
		dest = ""
	case o.destPrefix != "":
		dest = o.destPrefix
	}
	src, err := dialMirrorEnd(ctx, "source", "--from", o.from, o.cacert, o.cert, o.key, o.user, o.password, timeout)
	if err != nil {
		return err
	}
	defer src.c.Close()
	dst, err := dialMirrorEnd(ctx, "destination", "--to", o.to, o.dcacert, o.dcert, o.dkey, o.duser, o.dpassword, timeout)
	if err != nil {
		return err
	}
	defer dst.c.Close()
	if err := checkNotSelf(ctx, src, dst, o.prefix, dest, timeout); err != nil {
		return err
	}
	out = &lockedWriter{w: out}
	m := &etcdMirror{src: src.c, dst: dst.c, prefix: o.prefix, dest: dest, maxOps: o.maxTxnOps, timeout: timeout, out: out}
	stopProgress := m.printProgress(out, o.progress)
	err = m.run(ctx)
	stopProgress()
	fmt.Fprintln(out, m.status())
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || err == nil) {
		return nil // interrupted: the normal end of a mirror
	}
	return err
}

// checkNotSelf refuses a destination in the source's own cluster whose
// keys overlap the source's prefix: the mirror would copy its own
// writes for ever. Both ends answer a Get, which also tells a source or
// destination that cannot be reached (exit 3) before anything is copied.
func checkNotSelf(ctx context.Context, src, dst *mirrorEnd, prefix, dest string, timeout time.Duration) error {
	ids := make([]uint64, 2)
	for i, e := range []*mirrorEnd{src, dst} {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := e.c.Get(cctx, "\x00", clientv3.WithCountOnly())
		cancel()
		if err != nil {
			if c := status.Code(err); errors.Is(err, context.DeadlineExceeded) || c == codes.Unavailable || c == codes.DeadlineExceeded {
				return &exitError{code: ExitUnreachable, err: fmt.Errorf("reach the %s: %w", e.name, err)}
			}
			return fmt.Errorf("read the %s: %w", e.name, err)
		}
		ids[i] = resp.Header.ClusterId
	}
	if ids[0] != 0 && ids[0] == ids[1] && (strings.HasPrefix(dest, prefix) || strings.HasPrefix(prefix, dest)) {
		return usage("--from and --to reach the same cluster (ID %x) and --prefix %q overlaps the destination prefix %q: the mirror would copy its own writes for ever", ids[0], prefix, dest)
	}
	return nil
}

// etcdMirror copies the keys under prefix from src to dst, under dest
// instead of prefix.
type etcdMirror struct {
	src, dst     *clientv3.Client
	prefix, dest string
	maxOps       int
	timeout      time.Duration // bounds one write to the destination
	out          io.Writer     // progress lines
	copied       atomic.Int64  // puts and deletes applied, as make-mirror counts
	rev          atomic.Int64  // the source revision applied up to
}

func (m *etcdMirror) status() string {
	return fmt.Sprintf("mirror: %d keys copied, source revision %d", m.copied.Load(), m.rev.Load())
}

// printProgress prints the status every interval (none when 0) until
// the returned stop is called.
func (m *etcdMirror) printProgress(out io.Writer, every time.Duration) (stop func()) {
	if every == 0 {
		return func() {}
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintln(out, m.status())
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

func (m *etcdMirror) rename(key []byte) string {
	return m.dest + strings.TrimPrefix(string(key), m.prefix)
}

// run copies the prefix at the source's current revision with
// mirror.Syncer, as make-mirror does, then applies the source's watch
// events from the next revision until ctx ends or the watch fails.
func (m *etcdMirror) run(ctx context.Context) error {
	// The revision is read here rather than left to the Syncer, which
	// keeps it to itself, so that progress can name it.
	resp, err := m.src.Get(ctx, m.prefix+"\x00", clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("read the source: %w", err)
	}
	base := resp.Header.Revision
	s := mirror.NewSyncer(m.src, m.prefix, base)
	pages, errc := s.SyncBase(ctx)
	for page := range pages {
		for _, kv := range page.Kvs {
			// Without the lease: the source's lease IDs mean nothing in
			// the destination, as in make-mirror.
			if _, err := m.dst.Put(ctx, m.rename(kv.Key), string(kv.Value)); err != nil {
				return fmt.Errorf("write %q to the destination: %w", kv.Key, err)
			}
			m.copied.Add(1)
		}
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("read the source at revision %d: %w", base, err)
	}
	m.rev.Store(base)
	fmt.Fprintf(m.out, "%s: the copy at revision %d is done; following changes\n", m.status(), base)
	for wr := range s.SyncUpdates(ctx) {
		if wr.CompactRevision != 0 {
			return fmt.Errorf("%w (compacted at %d)", errMirrorCompacted, wr.CompactRevision)
		}
		if err := wr.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return fmt.Errorf("%w: %w", errMirrorCompacted, err)
			}
			return fmt.Errorf("watch the source: %w", err)
		}
		if err := m.apply(ctx, wr.Events); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// apply writes events, which arrive in revision order, one transaction
// per source revision (or several, of at most maxOps operations, for a
// revision with more changes than the destination takes in one).
func (m *etcdMirror) apply(ctx context.Context, events []*clientv3.Event) error {
	var ops []clientv3.Op
	var rev int64
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		// An interrupt lets the write in flight finish (within the
		// timeout), so that the last line counts what was copied
		// rather than leaving that write in doubt.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.timeout)
		_, err := m.dst.Txn(wctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("apply source revision %d to the destination: %w", rev, err)
		}
		m.copied.Add(int64(len(ops)))
		m.rev.Store(rev)
		ops = ops[:0]
		return nil
	}
	for _, ev := range events {
		if ev.Kv.ModRevision != rev || len(ops) == m.maxOps {
			if err := flush(); err != nil {
				return err
			}
		}
		rev = ev.Kv.ModRevision
		switch ev.Type {
		case mvccpb.PUT:
			ops = append(ops, clientv3.OpPut(m.rename(ev.Kv.Key), string(ev.Kv.Value)))
		case mvccpb.DELETE:
			ops = append(ops, clientv3.OpDelete(m.rename(ev.Kv.Key)))
		default:
			return fmt.Errorf("source revision %d: unknown event type %v", rev, ev.Type)
		}
	}
	return flush()
}

// lockedWriter lets the progress ticker and the mirror write lines to
// one writer.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

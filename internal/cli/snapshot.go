package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/etcdapi"
	"github.com/tenurehq/tenure/raftnode"
)

// NewSnapshotCommand builds `tenure snapshot save` and `tenure snapshot
// restore`.
func NewSnapshotCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Save the cluster's state to a file, or start a new cluster from one",
		Long: `Save a consistent copy of the cluster's whole state — every session, lease,
holder, waiter and key, with the revision fencing tokens carry on from — to
a file, from any node; and restore such a file into an empty data dir, as
the start of a new one-node cluster.`,
		Example: `  tenure snapshot save backup.snap
  tenure snapshot restore backup.snap --data-dir ./restored`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usage("snapshot needs a subcommand: save or restore (see tenure snapshot --help)")
		},
	}
	cmd.AddCommand(newSnapshotSaveCommand(g), newSnapshotRestoreCommand())
	return cmd
}

func newSnapshotSaveCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "save FILE",
		Short: "Save a consistent copy of the cluster's state to FILE",
		Long: `Save a consistent copy of the cluster's whole state to FILE and print its
revision and size. Any node will do: the leader takes the copy after a
linearizable read, so it holds every write acknowledged before the command
started. The copy's SHA-256 is checked, and FILE is replaced atomically (a
temporary file in the same directory, fsynced, then renamed), so it is
either the old file or the whole new copy, even after a crash.`,
		Example: `  tenure snapshot save backup.snap
  tenure snapshot save /backups/tenure-$(date +%F).snap --endpoints 10.0.0.5:7480`,
		Args: exactArgs("save takes the FILE to write"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			if path == "" {
				return usage("FILE is empty")
			}
			if fi, err := os.Stat(path); err == nil && fi.IsDir() {
				return usage("%s is a directory: give a file name", path)
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				var revision int64
				size, err := writeFileAtomic(path, func(w io.Writer) error {
					var err error
					revision, err = c.Snapshot(ctx, w)
					return err
				})
				if err != nil {
					return unreachable(err)
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "saved revision %d to %s (%d bytes)\n", revision, path, size)
				return err
			})
		},
	}
}

// writeFileAtomic writes path through write, by way of a temporary file
// in the same directory that is fsynced and renamed over path, then
// fsyncs the directory: after a crash path holds either what it held
// before or all of the new content. It returns the bytes written.
func writeFileAtomic(path string, write func(io.Writer) error) (int64, error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, fmt.Errorf("create a temporary file next to %s: %w", path, err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	cw := &countingWriter{w: f}
	if err := write(cw); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("close %s: %w", f.Name(), err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return 0, fmt.Errorf("rename to %s: %w", path, err)
	}
	done = true
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return cw.n, fmt.Errorf("fsync %s: %w", dir, err)
		}
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type restoreOptions struct {
	dataDir, nodeID, peerListen, peerAdvertise, logStore string
}

func newSnapshotRestoreCommand() *cobra.Command {
	var o restoreOptions
	cmd := &cobra.Command{
		Use:   "restore FILE --data-dir DIR",
		Short: "Write a saved state into an empty data dir, as the start of a new cluster",
		Long: `Write the state saved in FILE (by tenure snapshot save, or by etcdctl snapshot
save against Tenure's etcd API, whose sha256 is checked) into --data-dir, as
the start of a new cluster whose only voter is this node, then print the
tenure serve command that starts it. No server runs meanwhile: this works
on files alone. The node starts with every session, lease, holder, waiter
and key in FILE, and its revisions — hence fencing tokens — carry on above
every one in FILE. Sessions get a full TTL from the start, so holders that
are still alive can carry on heartbeating. Grow the cluster from there by
starting more nodes with --join.

--data-dir must hold no raft state: restore never overwrites a node's
history. --node-id, --peer-listen, --peer-advertise and --log-store mean what
they mean to tenure serve, and must be given to it the same way: the node ID
defaults, as there, to --peer-advertise, else --peer-listen.`,
		Example: `  tenure snapshot restore backup.snap --data-dir ./tenure-data
  tenure snapshot restore backup.snap --data-dir /var/lib/tenure --peer-listen 10.0.0.5:7481`,
		Args: exactArgs("restore takes the FILE to read"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runRestore(cmd, args[0], o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", "", "the new node's data directory, which must hold no raft state (required)")
	f.StringVar(&o.nodeID, "node-id", "", "the new node's raft ID (default: --peer-advertise, else --peer-listen, as tenure serve)")
	f.StringVar(&o.peerListen, "peer-listen", "127.0.0.1:7481", "the raft address the node will listen on, as for tenure serve")
	f.StringVar(&o.peerAdvertise, "peer-advertise", "", "the raft address other nodes will reach it at, as for tenure serve")
	f.StringVar(&o.logStore, "log-store", "wal", `raft log store: "wal" or "boltdb", as for tenure serve`)
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}

func runRestore(cmd *cobra.Command, path string, o restoreOptions) error {
	if o.dataDir == "" {
		return usage("--data-dir is empty")
	}
	if o.logStore != "wal" && o.logStore != "boltdb" {
		return usage(`--log-store %q: must be "wal" or "boltdb"`, o.logStore)
	}
	if err := checkPeerAddr("--peer-listen", o.peerListen, o.peerAdvertise == ""); err != nil {
		return err
	}
	if o.peerAdvertise != "" {
		if err := checkPeerAddr("--peer-advertise", o.peerAdvertise, true); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return usage("snapshot file: %v", err)
	}
	// etcdctl snapshot save against Tenure's etcd API writes the state
	// wrapped with its sha256; OpenSnapshot checks and unwraps it.
	state, err := etcdapi.OpenSnapshot(data)
	if err != nil {
		return unmet(fmt.Errorf("restore %s: %w", path, err))
	}
	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("create --data-dir: %w", err)
	}
	nodeID := serveNodeID(o.nodeID, o.peerListen, o.peerAdvertise)
	revision, err := raftnode.Seed(raftnode.Config{
		NodeID:    nodeID,
		DataDir:   dataDir,
		PeerAddr:  o.peerListen,
		Advertise: o.peerAdvertise,
		LogStore:  o.logStore,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, bytes.NewReader(state))
	switch {
	case errors.Is(err, raftnode.ErrHasState):
		return usage("--data-dir %s already holds a node's raft state: restore only into an empty directory (a new node), never over a node's history", o.dataDir)
	case err != nil:
		return unmet(fmt.Errorf("restore %s: %w", path, err))
	}
	serve := []string{"tenure", "serve", "--data-dir", shellQuote(o.dataDir), "--peer-listen", shellQuote(o.peerListen)}
	if o.peerAdvertise != "" {
		serve = append(serve, "--peer-advertise", shellQuote(o.peerAdvertise))
	}
	if o.nodeID != "" {
		serve = append(serve, "--node-id", shellQuote(o.nodeID))
	}
	if o.logStore != "wal" {
		serve = append(serve, "--log-store", o.logStore)
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "restored revision %d from %s into %s as node %s, the only voter of a new cluster\n", revision, path, dataDir, nodeID)
	fmt.Fprintf(w, "start it with (add --listen and --advertise as needed):\n  %s\n", strings.Join(serve, " "))
	return nil
}

// serveNodeID is the raft ID `tenure serve` gives a node: --node-id, else
// --peer-advertise, else --peer-listen. Restore derives the same one, so
// that the restored node starts with the flags it was restored with.
func serveNodeID(nodeID, peerListen, peerAdvertise string) string {
	switch {
	case nodeID != "":
		return nodeID
	case peerAdvertise != "":
		return peerAdvertise
	}
	return peerListen
}

// shellQuote quotes s for sh when it holds anything but the characters
// of paths and addresses.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@%+=,[]") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// checkPeerAddr checks a raft address given to restore. The address the
// node is known by (dialable) goes into the new cluster's configuration,
// so it must be one other nodes can dial.
func checkPeerAddr(flag, addr string, dialable bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usage("%s %q: want host:port: %v", flag, addr, err)
	}
	if ip := net.ParseIP(host); dialable && (host == "" || ip != nil && ip.IsUnspecified()) {
		return usage("%s %s is every interface, not an address other nodes can dial: give the one they reach this node at with --peer-advertise", flag, addr)
	}
	return nil
}

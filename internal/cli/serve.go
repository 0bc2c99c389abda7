package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/auth"
	"github.com/tenurehq/tenure/internal/certs"

	"github.com/tenurehq/tenure/raftnode"
	"github.com/tenurehq/tenure/server"
)

type serveOptions struct {
	listen, peerListen, dataDir, nodeID, logStore, logLevel string
	advertise, peerAdvertise                                string
	join                                                    []string
	bootstrapExpect                                         int
	snapshotThreshold, catchUpEntries                       uint64
	electionTimeout                                         time.Duration
	forceNewCluster                                         bool
	repairLog                                               bool
	walSegmentSize, minFreeSpace                            byteSize
	quotaBackendBytes                                       byteSize
	certFile, keyFile, clientCAFile                         string
	peerCertFile, peerKeyFile, peerCAFile                   string
	policyFile, auditLog                                    string
	insecure                                                bool
	etcdListen, etcdAdvertise                               string
	bcryptCost                                              int
	kubernetesPrefix                                        string
	pprof                                                   bool
	autoCompactionMode, autoCompactionRetention             string
	limits                                                  server.Limits
	sources                                                 settingSources // where --config and TENURE_* set flags
}

// NewServeCommand builds `tenure serve`.
func NewServeCommand() *cobra.Command {
	o := serveOptions{limits: server.DefaultLimits()}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a Tenure server node (a single-node cluster by default)",
		Long: `Run a Tenure server node.

With no flags it starts a single-node cluster: the API, web page, /metrics,
/healthz and /readyz on 127.0.0.1:7480, the raft peer port on
127.0.0.1:7481, and its data in ./tenure-data. Every acknowledged write is
fsynced before the reply, by a quorum of the cluster's voters.

To form a cluster of N nodes, start each with --bootstrap-expect N and the
API addresses of the others in --join; once they have met they elect a
leader. To grow a running cluster, start a fresh node with --join naming any
member: it joins as a non-voter, catches up, then becomes a voter. A node
whose --data-dir already holds a cluster rejoins it and ignores both flags,
so the same command restarts it.

Any node serves clients: calls that need the leader are forwarded to it.
SIGINT or SIGTERM shut a node down cleanly, handing leadership to another
voter first if it leads. SIGHUP re-reads the certificates and the policy.

With no TLS and no policy, serve only listens on loopback: a --listen or
--peer-listen beyond it is refused unless TLS and --policy protect it (peer
TLS for --peer-listen), or --insecure says to serve unprotected anyway.

Every flag can also come from a YAML file named by --config (or
TENURE_CONFIG), whose keys are the flag names (listen: 0.0.0.0:7480,
join: [a:7480, b:7480], lease-gc-after: 1h), and from an environment
variable TENURE_ and the flag's name in upper case with '_' for '-'
(TENURE_LEASE_GC_AFTER=1h). The command line wins over the environment,
which wins over the file; an unknown key or a bad value in the file stops
serve with exit code 2, naming the file and the key. The client flags'
variables (TENURE_ENDPOINTS, TENURE_TOKEN, ...) do not apply to serve.`,
		Example: `  # Start a node with the defaults
  tenure serve

  # Three nodes on one machine forming one cluster
  tenure serve --listen 127.0.0.1:7480 --peer-listen 127.0.0.1:7481 --data-dir d1 \
    --bootstrap-expect 3 --join 127.0.0.1:7580,127.0.0.1:7680
  tenure serve --listen 127.0.0.1:7580 --peer-listen 127.0.0.1:7581 --data-dir d2 \
    --bootstrap-expect 3 --join 127.0.0.1:7480,127.0.0.1:7680
  tenure serve --listen 127.0.0.1:7680 --peer-listen 127.0.0.1:7681 --data-dir d3 \
    --bootstrap-expect 3 --join 127.0.0.1:7480,127.0.0.1:7580

  # Add a fourth node to that cluster
  tenure serve --listen 127.0.0.1:7780 --peer-listen 127.0.0.1:7781 --data-dir d4 --join 127.0.0.1:7480

  # Listen on all interfaces, with TLS both ways and a policy (beyond
  # loopback serve requires them, or --insecure; see docs/security.md)
  tenure serve --listen 0.0.0.0:7480 --advertise 10.0.0.5:7480 \
    --peer-listen 0.0.0.0:7481 --peer-advertise 10.0.0.5:7481 --data-dir /var/lib/tenure \
    --cert-file server.pem --key-file server-key.pem --client-ca-file client-ca.pem \
    --peer-cert-file peer.pem --peer-key-file peer-key.pem --peer-ca-file ca.pem \
    --policy /etc/tenure/policy.yaml --audit-log /var/log/tenure/audit.log`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, args []string) error {
			var err error
			o.sources, err = applyConfig(cmd, os.Getenv)
			return err
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runServe(cmd, o)
		},
	}
	f := cmd.Flags()
	f.String(configFlag, "", "YAML file of flag settings (keys are flag names; env TENURE_CONFIG); the command line and TENURE_<FLAG> variables win over it")
	f.StringVar(&o.listen, "listen", "127.0.0.1:7480", "address for the API, web page and metrics")
	f.StringVar(&o.peerListen, "peer-listen", "127.0.0.1:7481", "address for raft traffic between nodes")
	f.StringVar(&o.dataDir, "data-dir", "./tenure-data", "directory for the log, snapshots and state")
	f.StringVar(&o.advertise, "advertise", "", "API address other nodes and clients reach this node at (default --listen; required when --listen is 0.0.0.0)")
	f.StringVar(&o.peerAdvertise, "peer-advertise", "", "raft address other nodes reach this node at (default --peer-listen; required when --peer-listen is 0.0.0.0)")
	f.StringSliceVar(&o.join, "join", nil, "API addresses of other nodes (host:port, comma-separated): join their cluster, or with --bootstrap-expect form one with them")
	f.IntVar(&o.bootstrapExpect, "bootstrap-expect", 0, "form a new cluster of this many voters once this node has met them through --join (every node given the same number)")
	f.StringVar(&o.nodeID, "node-id", "", "this node's raft ID (default: derived from --peer-advertise or --peer-listen)")
	f.StringVar(&o.logStore, "log-store", "wal", `raft log store: "wal" (raft-wal) or "boltdb" (raft-boltdb/v2)`)
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.certFile, "cert-file", "", "serve the API over TLS only, with this PEM certificate (re-read when it changes; see tenure certs init)")
	f.StringVar(&o.keyFile, "key-file", "", "the PEM private key of --cert-file")
	f.StringVar(&o.clientCAFile, "client-ca-file", "", "with --cert-file, require client certificates signed by this PEM CA")
	f.StringVar(&o.peerCertFile, "peer-cert-file", "", "make raft traffic between nodes TLS, presenting this PEM certificate (re-read when it changes)")
	f.StringVar(&o.peerKeyFile, "peer-key-file", "", "the PEM private key of --peer-cert-file")
	f.StringVar(&o.peerCAFile, "peer-ca-file", "", "the PEM CA every node's peer certificate must come from; a node without one can neither join nor exchange raft traffic")
	f.StringVar(&o.policyFile, "policy", "", "authenticate every caller (bearer token or client certificate) and check each call against this YAML policy, re-read when it changes and on SIGHUP (see docs/security.md)")
	f.StringVar(&o.auditLog, "audit-log", "", "with --policy, append the audit trail (admin actions, denied calls, policy reloads) to this file as JSON lines (default: the log)")
	f.StringVar(&o.etcdListen, "etcd-listen", "", "also serve the etcd v3 API (gRPC) on this address, for etcdctl and every etcd client (docs/etcd.md); off when empty")
	f.IntVar(&o.bcryptCost, "bcrypt-cost", 10, "cost of the password hashes etcd's users get (etcdctl user add, passwd), as etcd's flag: each login pays it (10 is tens of milliseconds; 4 to 31)")
	f.StringVar(&o.etcdAdvertise, "etcd-advertise", "", "etcd API address clients and other nodes reach this node at (default --etcd-listen; required when it is 0.0.0.0)")
	f.BoolVar(&o.pprof, "enable-pprof", false, "serve Go's runtime profiles at /debug/pprof/ on --listen (CPU, heap, goroutines, execution trace); with --policy only an admin may read them")
	f.StringVar(&o.kubernetesPrefix, "kubernetes-prefix", "/registry", `the --etcd-prefix of a kube-apiserver storing its objects here: its coordination.k8s.io Leases (<prefix>/leases/<namespace>/<name>) show on the page, in tenure get lease -A and the per-lease metrics, and each holder change is audited (docs/kubernetes.md); "off" (or empty) turns that off`)
	f.StringVar(&o.autoCompactionMode, "auto-compaction-mode", "revision", `how the keys' history is compacted, as etcd's flag: "revision" keeps the last --auto-compaction-retention revisions, "periodic" those of the last --auto-compaction-retention duration`)
	f.StringVar(&o.autoCompactionRetention, "auto-compaction-retention", "10000", `revisions to keep ("revision" mode) or a duration ("periodic" mode: 1h, or a bare number of hours as etcd takes it); 0 keeps everything until a client compacts`)
	f.Var(&o.quotaBackendBytes, "quota-backend-bytes", "bytes this node may hold in memory, as etcd's flag (default 2GiB; 0 means the default): live keys, their retained history, sessions, leases, the watch history and the in-memory raft log; past it the NOSPACE alarm refuses writes that add data until `etcdctl alarm disarm` (docs/operations.md)")
	f.BoolVar(&o.insecure, "insecure", false, "allow listening on a non-loopback address without TLS and a policy (anybody who can reach the port can do anything)")
	f.BoolVar(&o.forceNewCluster, "force-new-cluster", false, "restore a copied data dir onto this node: rewrite its cluster configuration to this node alone at --peer-listen, keeping the data (never on a member of a live cluster; see docs/operations.md)")
	o.walSegmentSize = 64 << 20
	f.Var(&o.walSegmentSize, "wal-segment-size", "size of each raft-wal log segment, preallocated when created (e.g. 4MiB for a small disk)")
	f.Var(&o.minFreeSpace, "min-free-space", "free disk space to keep: below it writes that add state are refused until space is freed (default twice --wal-segment-size; 0 turns it off)")
	f.BoolVar(&o.repairLog, "repair-log", false, "start on a log whose checksums fail by cutting the damaged entries off, losing acknowledged writes unless a snapshot covers them (see docs/operations.md)")
	f.Uint64Var(&o.snapshotThreshold, "snapshot-threshold", 8192, "log entries between snapshots")
	// Half etcd's 1s: a leader's death is noticed in 0.5-1s, so a
	// failover, election and promotion included, takes about a second
	// (docs/benchmarks.md), well inside the 2s minimum TTL. 20ms made
	// leadership flap on two loaded cores.
	f.DurationVar(&o.electionTimeout, "election-timeout", 500*time.Millisecond, "raft: a follower that hears nothing from the leader for this long (raft draws between it and twice it) stands for election; the leader heartbeats every tenth of it and steps down after one without hearing from a quorum; a new leader adds twice it to every session's deadline")
	// The hashicorp/raft engine's timeouts, which the etcd raft engine
	// derives from --election-timeout: kept so that a config that sets
	// them still starts, with a warning.
	for _, old := range []string{"heartbeat-timeout", "leader-lease-timeout"} {
		f.Duration(old, 0, "")
		_ = f.MarkDeprecated(old, "ignored since the etcd raft engine: it heartbeats every tenth of --election-timeout and its leader steps down after an election timeout without a quorum")
	}
	f.Duration("snapshot-interval", 0, "")
	_ = f.MarkDeprecated("snapshot-interval", "ignored since the etcd raft engine: it checks --snapshot-threshold after every applied batch")
	f.Uint64Var(&o.catchUpEntries, "catch-up-entries", 10240, "log entries kept behind each snapshot for a lagging node to catch up from; a node further behind is sent the snapshot")
	l := &o.limits
	f.IntVar(&l.MaxNameBytes, "max-name-bytes", l.MaxNameBytes, "longest key, lease name or identity the native API writes")
	f.IntVar(&l.MaxValueBytes, "max-value-bytes", l.MaxValueBytes, "largest key or lease value the native API writes")
	f.IntVar(&l.MaxRequestBytes, "max-request-bytes", l.MaxRequestBytes, "largest request message of the native API")
	f.IntVar(&l.EtcdMaxRequestBytes, "etcd-max-request-bytes", l.EtcdMaxRequestBytes, "largest request of the etcd API, as etcd's --max-request-bytes (default 1.5 MiB, as etcd's): its only bound on keys and values")
	f.IntVar(&l.EtcdMaxResponseBytes, "etcd-max-response-bytes", l.EtcdMaxResponseBytes, "largest answer of the etcd API, counted as the keys and values of a Range or of a Txn's ranges and prev_kvs: one past it is refused (ResourceExhausted) without being built (etcd leaves answers to gRPC's 2 GiB)")
	f.DurationVar(&l.RequestReadTimeout, "request-read-timeout", l.RequestReadTimeout, "longest time to receive a request's body, 0 for no bound (streams such as heartbeats are exempt)")
	f.DurationVar(&l.PipelineIdleTimeout, "pipeline-idle-timeout", l.PipelineIdleTimeout, "close a client's pipeline connection after this long with nothing in flight (its client dials again), 0 for no bound")
	f.DurationVar(&l.MinTTL, "min-ttl", l.MinTTL, "shortest session or key TTL")
	f.DurationVar(&l.MaxTTL, "max-ttl", l.MaxTTL, "longest session or key TTL")
	f.DurationVar(&l.DefaultTTL, "default-ttl", l.DefaultTTL, "session TTL when a client names none")
	f.IntVar(&l.MaxSessionsPerIdentity, "max-sessions-per-identity", l.MaxSessionsPerIdentity, "open sessions one holder identity may have")
	f.IntVar(&l.MaxWaitersPerLease, "max-waiters-per-lease", l.MaxWaitersPerLease, "sessions that may queue for one lease")
	f.IntVar(&l.MaxWaits, "max-waits", l.MaxWaits, "waits parked on this node at once (waiting acquires and holders' grant watches), over every caller; 0 for no limit (a policy's waits bounds each principal)")
	f.IntVar(&l.MaxWatches, "max-watches", l.MaxWatches, "lease and key watches open on this node at once, over every caller; 0 for no limit (a policy's watches bounds each principal)")
	f.IntVar(&l.MaxCapacity, "max-capacity", l.MaxCapacity, "largest semaphore capacity")
	f.IntVar(&l.MaxLabels, "max-labels", l.MaxLabels, "labels one session or lease may carry")
	f.IntVar(&l.MetricsLeaseNames, "metrics-lease-names", l.MetricsLeaseNames, "lease names with per-lease metric series of their own (first come; the rest count as lease=\"(other)\"; a collected lease frees its slot)")
	f.DurationVar(&l.MaxHold, "max-hold-limit", l.MaxHold, "the longest max_hold a lease may ask for; 0 allows any")
	f.DurationVar(&l.MaxHoldGrace, "max-hold-grace", l.MaxHoldGrace, "after asking a holder past its lease's max_hold to step down, revoke its grant this much later")
	f.DurationVar(&l.LeaseGCAfter, "lease-gc-after", l.LeaseGCAfter, "delete a lease record idle this long (no holders, waiters or lock-delay), unless its acquire named its own gc_after; 0 keeps records forever")
	f.IntVar(&l.WatchHistory, "watch-history", l.WatchHistory, "events kept for watchers; a watcher further behind is cancelled and told to resync")
	return cmd
}

func runServe(cmd *cobra.Command, o serveOptions) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: %w", o.logLevel, err)
	}
	if err := o.limits.Validate(); err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	if o.logStore != "wal" && o.logStore != "boltdb" {
		return fmt.Errorf(`--log-store %q: must be "wal" or "boltdb"`, o.logStore)
	}
	logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
	if o.sources.File != "" || len(o.sources.Env) > 0 {
		logger.Info("settings read", "config", o.sources.File, "env", o.sources.Env)
	}
	if err := os.MkdirAll(o.dataDir, 0o750); err != nil {
		return fmt.Errorf("create --data-dir: %w", err)
	}
	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	nodeID := serveNodeID(o.nodeID, o.peerListen, o.peerAdvertise)
	if o.electionTimeout < 10*time.Millisecond {
		return usage("--election-timeout %v: must be at least 10ms", o.electionTimeout)
	}
	if o.bootstrapExpect < 0 {
		return usage("--bootstrap-expect %d: must be at least 1", o.bootstrapExpect)
	}
	if o.bootstrapExpect > 1 && len(o.join) == 0 {
		return usage("--bootstrap-expect %d: give the other nodes' API addresses with --join", o.bootstrapExpect)
	}
	for _, a := range []struct{ flag, addr, example string }{
		{"--listen", o.listen, "127.0.0.1:7480"}, {"--peer-listen", o.peerListen, "127.0.0.1:7481"},
		{"--advertise", o.advertise, "10.0.0.5:7480"}, {"--peer-advertise", o.peerAdvertise, "10.0.0.5:7481"},
		{"--etcd-listen", o.etcdListen, "127.0.0.1:2379"}, {"--etcd-advertise", o.etcdAdvertise, "10.0.0.5:2379"},
	} {
		if a.addr == "" && (strings.HasSuffix(a.flag, "advertise") || a.flag == "--etcd-listen") {
			continue // left out: the listen address, or no etcd API
		}
		if err := checkHostPort(a.addr, a.example); err != nil {
			return usage("%s %q: %v", a.flag, a.addr, err)
		}
	}
	if host, _, err := net.SplitHostPort(o.listen); err == nil && o.advertise == "" {
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			return usage("--listen %s listens on every interface: give the address other nodes and clients reach this node at with --advertise", o.listen)
		}
	}
	for _, a := range o.join {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return usage("--join %q: want host:port of another node's API: %v", a, err)
		}
	}
	if o.walSegmentSize < 1<<20 || o.walSegmentSize > 1<<30 {
		return fmt.Errorf("--wal-segment-size %s must be between 1MiB and 1GiB", o.walSegmentSize)
	}
	minFree := int64(o.minFreeSpace) // 0: the default, twice the segment size
	if cmd.Flags().Changed("min-free-space") && minFree == 0 {
		minFree = -1 // asked for no reserve
	}
	if o.etcdListen != "" && o.etcdAdvertise == "" {
		if host, _, err := net.SplitHostPort(o.etcdListen); err == nil {
			if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
				return usage("--etcd-listen %s listens on every interface: give the address clients reach this node's etcd API at with --etcd-advertise", o.etcdListen)
			}
		}
	}
	compaction, err := o.compaction()
	if err != nil {
		return err
	}
	if q := o.quotaBackendBytes; q != 0 && q < minQuotaBackendBytes {
		return usage("--quota-backend-bytes %s: must be at least %s, or 0 for the default 2GiB", q, minQuotaBackendBytes)
	}
	if err := o.checkExposure(); err != nil {
		return err
	}
	if o.insecure {
		logger.Warn("--insecure: serving without the protection of TLS and a policy", "listen", o.listen, "peer_listen", o.peerListen)
	}
	tlsConfig, err := o.tls()
	if err != nil {
		return err
	}
	peerTLS, err := o.peerTLS()
	if err != nil {
		return err
	}
	authn, audit, closeAudit, err := o.auth(logger)
	if err != nil {
		return err
	}
	defer closeAudit()
	// Before any port is bound: a second node on this data dir would
	// otherwise wait for the log store's own lock, forever and silently.
	lock, err := raftnode.LockDataDir(dataDir)
	if errors.Is(err, raftnode.ErrDataDirInUse) {
		return &exitError{code: ExitUnmet, err: err}
	}
	if err != nil {
		return err
	}
	defer lock.Unlock()
	ctx := cmd.Context()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return &exitError{code: ExitUnreachable, err: fmt.Errorf("--listen %s: %w", o.listen, err)}
	}
	var etcdLn net.Listener
	if o.etcdListen != "" {
		if etcdLn, err = net.Listen("tcp", o.etcdListen); err != nil {
			ln.Close()
			return &exitError{code: ExitUnreachable, err: fmt.Errorf("--etcd-listen %s: %w", o.etcdListen, err)}
		}
	}
	build := readBuildInfo()
	srv, err := openServer(ctx, server.Config{
		Etcd:             server.EtcdConfig{Listener: etcdLn, Advertise: o.etcdAdvertise, Compaction: compaction, BcryptCost: o.bcryptCost},
		Quota:            server.StorageQuota{Bytes: int64(o.quotaBackendBytes)},
		KubernetesPrefix: o.kubernetesView(),
		Pprof:            o.pprof,
		Listener:         ln,
		Advertise:        o.advertise,
		Join:             o.join,
		BootstrapExpect:  o.bootstrapExpect,
		TLS:              tlsConfig,
		PeerAPITLS:       peerAPITLS(tlsConfig, peerTLS),
		Auth:             authn,
		Audit:            audit,
		Limits:           o.limits,
		Logger:           logger,
		Build:            server.BuildInfo{Version: build.Version, Commit: build.Commit, GoVersion: build.GoVersion},
		Raft: raftnode.Config{
			NodeID:    nodeID,
			DataDir:   dataDir,
			PeerAddr:  o.peerListen,
			Advertise: o.peerAdvertise,
			LogStore:  o.logStore,
			PeerTLS:   peerTLS,
			Bootstrap: true,

			ForceNewCluster: o.forceNewCluster,
			RepairLog:       o.repairLog,
			WALSegmentSize:  int(o.walSegmentSize),
			MinFreeBytes:    minFree,

			SnapshotThreshold: o.snapshotThreshold,
			CatchUpEntries:    o.catchUpEntries,
			ElectionTimeout:   o.electionTimeout,
		},
	})
	if err != nil {
		return startError(err)
	}
	if authn != nil {
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		go authn.Policy.Watch(watchCtx, time.Second)
	}
	// SIGHUP re-reads the certificates and the policy now, rather than
	// at the next check of their files.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
wait:
	for {
		select {
		case <-ctx.Done():
			logger.Info("shutting down", "reason", "signal")
			break wait
		case err = <-srv.Err():
			logger.Error("serving failed", "err", err)
			break wait
		case <-hup:
			logger.Info("SIGHUP: re-reading certificates and policy")
			certs.Reread()
			if authn != nil {
				_ = authn.Policy.Reload() // its outcome is audited
			}
		}
	}
	start := time.Now()
	if cerr := srv.Close(); cerr != nil && err == nil {
		err = cerr
	}
	logger.Info("stopped", "took", time.Since(start).Round(time.Millisecond))
	return err
}

// openServer runs server.Open, which replays the log and can take a
// while, but returns as soon as ctx ends (SIGINT, SIGTERM); a server that
// opens after that is closed again. It closes cfg.Listener when the
// server does not open.
func openServer(ctx context.Context, cfg server.Config) (*server.Server, error) {
	type opened struct {
		srv *server.Server
		err error
	}
	done := make(chan opened, 1)
	go func() {
		srv, err := server.Open(cfg)
		if err != nil {
			cfg.Listener.Close()
		}
		done <- opened{srv, err}
	}()
	select {
	case o := <-done:
		return o.srv, o.err
	case <-ctx.Done():
		go func() {
			if o := <-done; o.err == nil {
				o.srv.Close()
			}
		}()
		return nil, &exitError{code: ExitUnmet, err: errors.New("interrupted by a signal while starting; the node did not start")}
	}
}

// tls is the API's TLS configuration from --cert-file, --key-file and
// --client-ca-file, or nil for cleartext.
func (o *serveOptions) tls() (*tls.Config, error) {
	switch {
	case o.certFile == "" && o.keyFile == "" && o.clientCAFile == "":
		return nil, nil
	case o.certFile == "" || o.keyFile == "":
		return nil, usage("--cert-file and --key-file go together: give both")
	case (len(o.join) > 0 || o.bootstrapExpect > 1) && o.peerCertFile == "":
		// Nodes forward calls to each other over the API, presenting
		// their peer certificates and checking the others' API
		// certificates against the peer CA.
		return nil, usage("--cert-file on a node of a cluster (--join, --bootstrap-expect) needs --peer-cert-file, --peer-key-file and --peer-ca-file: nodes call each other's API with their peer certificates")
	}
	var cfg *tls.Config
	var err error
	if o.policyFile != "" {
		// Client certificates are checked by the policy's
		// authenticator, which can tell a node from a client.
		cfg, err = certs.AuthServerConfig(o.certFile, o.keyFile)
	} else {
		cfg, err = certs.ServerConfig(o.certFile, o.keyFile, o.clientCAFile, o.peerCAFile)
	}
	if err != nil {
		return nil, usage("%v", err)
	}
	return cfg, nil
}

// checkHostPort checks that addr is host:port with a port net.Listen
// takes, before anything judges the host: "127.0.0.1" alone must be
// told of its missing port, not that it is reachable from other
// machines.
func checkHostPort(addr, example string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port, e.g. %s (%w)", example, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// checkExposure refuses to serve an address beyond this machine in the
// clear to anybody, unless told to with --insecure.
func (o *serveOptions) checkExposure() error {
	if o.insecure {
		return nil
	}
	if !loopback(o.listen) && (o.certFile == "" || o.policyFile == "") {
		return usage("--listen %s is reachable from other machines, and without TLS (--cert-file, --key-file) and a policy (--policy) anybody who reaches it could take or revoke any lock; add them (docs/security.md), or pass --insecure to serve it unprotected anyway", o.listen)
	}
	if o.etcdListen != "" && !loopback(o.etcdListen) && (o.certFile == "" || o.policyFile == "") {
		return usage("--etcd-listen %s is reachable from other machines, and without TLS (--cert-file, --key-file) and a policy (--policy) anybody who reaches it could take or revoke any lock; add them (docs/security.md), or pass --insecure to serve it unprotected anyway", o.etcdListen)
	}
	if !loopback(o.peerListen) && o.peerCertFile == "" {
		return usage("--peer-listen %s is reachable from other machines, and without peer TLS (--peer-cert-file, --peer-key-file, --peer-ca-file) anybody who reaches it could join the cluster or forge raft traffic; add them (docs/security.md), or pass --insecure to serve it unprotected anyway", o.peerListen)
	}
	return nil
}

// minQuotaBackendBytes is the smallest --quota-backend-bytes: below it
// the watch history's ring alone (allocated up front) would fill it.
const minQuotaBackendBytes = byteSize(32 << 20)

// compaction reads --auto-compaction-mode and -retention as etcd does: a
// number of revisions, or a duration where a bare number is hours.
// kubernetesView is server.Config.KubernetesPrefix: --kubernetes-prefix,
// or "" (off) for "off" or an empty value. An empty environment
// variable counts as unset (config.go), so "off" is the word that works
// everywhere.
func (o *serveOptions) kubernetesView() string {
	if o.kubernetesPrefix == "off" {
		return ""
	}
	return o.kubernetesPrefix
}

func (o *serveOptions) compaction() (server.Compaction, error) {
	r := strings.TrimSpace(o.autoCompactionRetention)
	if r == "0" || r == "" {
		return server.Compaction{}, nil
	}
	switch o.autoCompactionMode {
	case "revision":
		n, err := strconv.ParseInt(r, 10, 64)
		if err != nil || n < 0 {
			return server.Compaction{}, usage("--auto-compaction-retention %q: revision mode keeps a whole number of revisions", r)
		}
		return server.Compaction{Mode: "revision", Revisions: n}, nil
	case "periodic":
		if h, err := strconv.ParseFloat(r, 64); err == nil && h > 0 {
			return server.Compaction{Mode: "periodic", Period: time.Duration(h * float64(time.Hour))}, nil
		}
		d, err := time.ParseDuration(r)
		if err != nil || d <= 0 {
			return server.Compaction{}, usage("--auto-compaction-retention %q: periodic mode keeps a duration (1h, 30m) or a number of hours", r)
		}
		return server.Compaction{Mode: "periodic", Period: d}, nil
	}
	return server.Compaction{}, usage(`--auto-compaction-mode %q: must be "revision" or "periodic"`, o.autoCompactionMode)
}

// loopback reports whether addr ("host:port") listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// auth builds the authenticator from --policy and the CA flags, and the
// audit log. Without --policy the policy is etcd's users and roles
// alone, in force once etcdctl enables auth (docs/security.md).
func (o *serveOptions) auth(logger *slog.Logger) (*auth.Authenticator, *slog.Logger, func(), error) {
	noop := func() {}
	if o.policyFile != "" && o.clientCAFile != "" && o.certFile == "" {
		return nil, nil, noop, usage("--client-ca-file needs --cert-file: client certificates come over TLS")
	}
	if o.policyFile != "" && (len(o.join) > 0 || o.bootstrapExpect > 1) && (o.certFile == "" || o.peerCertFile == "") {
		return nil, nil, noop, usage("--policy on a node of a cluster (--join, --bootstrap-expect) needs --cert-file and the --peer-* flags: nodes prove to each other that they are nodes with their peer certificates")
	}
	// A client CA that is also the peer CA would let clients speak as
	// nodes: refused with a policy file; without one (etcd's users
	// alone) no certificate is taken as a node's.
	sharedCA := false
	if o.clientCAFile != "" && o.peerCAFile != "" {
		same, err := certs.SameCA(o.clientCAFile, o.peerCAFile)
		if err != nil {
			return nil, nil, noop, usage("%v", err)
		}
		sharedCA = same
		if same && o.policyFile != "" {
			return nil, nil, noop, usage("--client-ca-file and --peer-ca-file share a CA: with a policy, a certificate from the peer CA speaks for the cluster's nodes, so clients need a CA of their own (tenure certs init writes client-ca.pem)")
		}
	}
	audit, closeAudit := logger.With("log", "audit"), noop
	if o.auditLog != "" {
		f, err := os.OpenFile(o.auditLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, nil, noop, fmt.Errorf("--audit-log: %w", err)
		}
		audit, closeAudit = slog.New(slog.NewJSONHandler(f, nil)), func() { f.Close() }
	}
	auditor := auth.NewAuditor(audit)
	src := auth.Static(nil)
	if o.policyFile != "" {
		var err error
		src, err = auth.Load(o.policyFile, func(p *auth.Policy, err error) {
			e := auth.Entry{Principal: "(operator)", Action: "policy.reload", Target: o.policyFile, Outcome: "allowed"}
			if err != nil {
				e.Outcome, e.Reason = "failed", err.Error()+"; the policy before it stays in force"
			}
			auditor.Record(context.Background(), e)
		})
		if err != nil {
			closeAudit()
			return nil, nil, noop, usage("--policy: %v", err)
		}
	}
	a := &auth.Authenticator{Policy: src}
	var err error
	if o.clientCAFile != "" {
		if a.ClientCAs, err = certs.Pool(o.clientCAFile, "--client-ca-file"); err != nil {
			closeAudit()
			return nil, nil, noop, usage("%v", err)
		}
	}
	if o.peerCAFile != "" && !sharedCA {
		if a.PeerCAs, err = certs.Pool(o.peerCAFile, "--peer-ca-file"); err != nil {
			closeAudit()
			return nil, nil, noop, usage("%v", err)
		}
	}
	return a, audit, closeAudit, nil
}

// peerTLS is raft's TLS configuration from the --peer-* flags, or nil.
func (o *serveOptions) peerTLS() (*tls.Config, error) {
	given := 0
	for _, f := range []string{o.peerCertFile, o.peerKeyFile, o.peerCAFile} {
		if f != "" {
			given++
		}
	}
	switch given {
	case 0:
		return nil, nil
	case 3:
	default:
		return nil, usage("--peer-cert-file, --peer-key-file and --peer-ca-file go together: give all three")
	}
	cfg, err := certs.PeerConfig(o.peerCertFile, o.peerKeyFile, o.peerCAFile)
	if err != nil {
		return nil, usage("%v", err)
	}
	return cfg, nil
}

// peerAPITLS is how a node with a TLS API calls the other nodes' APIs:
// with its peer certificate, checking theirs against the peer CA. Nil
// when the API is cleartext.
func peerAPITLS(api, peer *tls.Config) *tls.Config {
	if api == nil || peer == nil {
		return nil
	}
	return peer.Clone()
}

// startError adds what the operator can do to the errors a node cannot
// start past.
func startError(err error) error {
	var corrupt *raftnode.CorruptLogError
	switch {
	case errors.As(err, &corrupt):
		return fmt.Errorf("%w\nThe node refuses to replay a damaged log. Restore --data-dir from a backup, or start once with --repair-log to cut the damaged entries off (see docs/operations.md)", err)
	case errors.Is(err, raftnode.ErrDiskFull):
		return fmt.Errorf("%w\nFree space in --data-dir's file system, or start with a smaller --wal-segment-size", err)
	}
	return err
}

package raftnode

import (
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// latencyBuckets span an fsync on fast NVMe (~100µs) to a stalled disk or
// a slow quorum (1s).
var latencyBuckets = []float64{
	.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1,
}

type metrics struct {
	propose    prometheus.Histogram
	applyBatch prometheus.Histogram
	batchSize  prometheus.Histogram
	storeLogs  prometheus.Histogram
	applied    prometheus.Gauge
	isLeader   prometheus.Gauge
	diskFree   prometheus.Gauge
	diskFull   prometheus.Gauge
	restores   prometheus.Counter
	peers      *peerMetrics // the raft engine's transport

	reg        prometheus.Registerer
	registered []prometheus.Collector
}

// newMetrics always builds the collectors, so that the hot paths observe
// without nil checks; they are only exported when reg is non-nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		propose: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tenure_raft_propose_duration_seconds",
			Help:    "Time from Propose to the state machine's result for the entry.",
			Buckets: latencyBuckets,
		}),
		applyBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tenure_raft_apply_batch_duration_seconds",
			Help:    "Time to apply one batch of committed entries to the state machine, under the state write lock.",
			Buckets: latencyBuckets,
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tenure_raft_apply_batch_entries",
			Help:    "Entries per applied batch: how much group commit is happening.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11), // 1 .. 1024 = MaxAppendEntries ceiling
		}),
		storeLogs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tenure_raft_store_logs_duration_seconds",
			Help:    "Time for the WAL to durably write a batch of entries (the fsync latency).",
			Buckets: latencyBuckets,
		}),
		applied: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tenure_raft_applied_index",
			Help: "Index of the last log entry applied to the state machine.",
		}),
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tenure_raft_is_leader",
			Help: "1 while this node is the raft leader, else 0.",
		}),
		diskFree: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tenure_raft_disk_free_bytes",
			Help: "Free space in the data directory's file system, as last checked.",
		}),
		diskFull: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tenure_raft_disk_full",
			Help: "1 while client writes are refused because the data directory's file system is below the free-space reserve or a write failed for lack of space, else 0.",
		}),
		restores: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tenure_raft_snapshot_restores_total",
			Help: "State replaced by a snapshot: at start from this node's own, or sent by the leader to a node too far behind for the log.",
		}),
		peers: newPeerMetrics(),
		reg:   reg,
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.propose, m.applyBatch, m.batchSize, m.storeLogs, m.applied, m.isLeader, m.diskFree, m.diskFull, m.restores, m.peers.dropped} {
		if err := reg.Register(c); err != nil {
			m.unregister()
			return nil, err
		}
		m.registered = append(m.registered, c)
	}
	return m, nil
}

// unregister lets a node be reopened on the same registry, as tests and a
// restart-in-process do.
func (m *metrics) unregister() {
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}

// timedLogStore measures StoreLogs, where raft's leader and followers wait
// for the disk: the figure operators need when commit latency grows.
type timedWAL struct {
	raft.LogStore
	hist prometheus.Histogram
}

func (s timedWAL) StoreLog(l *raft.Log) error {
	start := time.Now()
	err := s.LogStore.StoreLog(l)
	s.hist.Observe(time.Since(start).Seconds())
	return err
}

func (s timedWAL) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	err := s.LogStore.StoreLogs(logs)
	s.hist.Observe(time.Since(start).Seconds())
	return err
}

// IsMonotonic must pass through: raft-wal cannot accept a gap in indexes,
// and raft only resets the log after a restore when the store says so.
func (s timedWAL) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

var _ raft.MonotonicLogStore = timedWAL{}

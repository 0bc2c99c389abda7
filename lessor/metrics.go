package lessor

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	sessions   prometheus.Gauge
	heartbeats prometheus.CounterFunc
	proposed   *prometheus.CounterVec
	failed     *prometheus.CounterVec
}

// newMetrics builds the metrics whether or not they are registered, so
// that the code counting them needs no nil checks.
func newMetrics(l *Lessor) metrics {
	return metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tenure_lessor_sessions",
			Help: "Sessions whose deadlines this leader is timing.",
		}),
		// Counted per shard and summed only when scraped: one shared
		// counter would be a cache line that every heartbeat fights over.
		heartbeats: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tenure_lessor_heartbeats_total",
			Help: "Heartbeats that renewed a session on this leader.",
		}, func() float64 {
			var n uint64
			for i := range l.shards {
				n += l.shards[i].beats.Load()
			}
			return float64(n)
		}),
		proposed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lessor_expiries_proposed_total",
			Help: "Expiries proposed to the log, by kind (session, key, lock_delay, lease_gc); retries count again.",
		}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_lessor_expiries_failed_total",
			Help: "Expiries whose proposal failed and is retried or abandoned, by kind.",
		}, []string{"kind"}),
	}
}

func (m metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.sessions, m.heartbeats, m.proposed, m.failed} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

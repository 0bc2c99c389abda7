package bench

import (
	"context"
	"errors"
	"time"
)

// --- 4: heartbeat capacity ---

// runHeartbeats opens sessions in steps (1k; 10k, 50k, 100k, 200k,
// 300k), spread
// over a few connections, and holds each step for longer than the TTL
// while the clients heartbeat as they do by default (every TTL/3, both
// clients). A step passes when no session expired, on the client's
// word or the server's. The result is the largest step passed, with the
// heartbeat rate the server counted, its CPU per heartbeat and its
// memory there.
func runHeartbeats(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	sz := e.sz
	conns := make([]conn, sz.heartbeatConns)
	for i := range conns {
		c, err := e.dial(ctx, dialOptions{})
		if err != nil {
			closeConns(conns)
			return nil, err
		}
		conns[i] = c
	}
	// Dropping the connections ends the sessions' heartbeats; the server
	// is stopped next, so there is no point in closing 100,000 sessions
	// one by one.
	defer closeConns(conns)
	ctr := e.sys.counters()
	start, err := e.srv.Usage()
	if err != nil {
		return nil, err
	}
	var sessions []session
	kept := 0
	for _, target := range sz.heartbeatSteps {
		began := time.Now()
		opened, err := openSessions(ctx, conns, target-len(sessions), sz.heartbeatTTL, began.Add(sz.heartbeatOpen))
		sessions = append(sessions, opened...)
		if err != nil {
			// Not a failure of the run: a server too busy to open more
			// sessions in time has found its capacity.
			e.log.Info("bench: heartbeats: could not open the sessions", "system", e.sys, "target", target, "opened", len(sessions), "err", err)
			r.add("sessions opened of "+thousands(int64(target)), float64(len(sessions)), "", Neither)
			break
		}
		e.log.Info("bench: heartbeats: opened", "system", e.sys, "sessions", len(sessions), "took", time.Since(began).Round(time.Millisecond))
		beats0, err1 := e.srv.Metric(ctx, ctr.heartbeats)
		exp0, err2 := e.srv.Metric(ctx, ctr.expiries, ctr.expiryMatch...)
		w := e.openWindow(ctx, 0, sz.heartbeatHold)
		oldest := func() time.Duration { return 0 }
		if e.sys == Tenure && e.client != ClientEtcd {
			// Tenure's client knows its sessions' last acknowledged
			// heartbeats; an etcd conn learns them only when dialled
			// to (the crash workload's trackAcks).
			oldest = watchHeartbeats(sessions)
		}
		cpu, rss, err3 := w.wait()
		age := oldest()
		beats1, err4 := e.srv.Metric(ctx, ctr.heartbeats)
		exp1, err5 := e.srv.Metric(ctx, ctr.expiries, ctr.expiryMatch...)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return nil, err
		}
		lost := countLost(sessions)
		expired := max(float64(lost), exp1-exp0)
		e.log.Info("bench: heartbeats: held", "system", e.sys, "sessions", len(sessions), "expired", expired,
			"lost_by_client", lost, "expired_by_server", exp1-exp0, "oldest_heartbeat", age.Round(time.Millisecond),
			"heartbeats/s", (beats1-beats0)/sz.heartbeatHold.Seconds())
		if expired > 0 {
			r.add("expirations at "+thousands(int64(target))+" sessions", expired, "", Neither)
			if age > 0 {
				r.add("oldest acknowledged heartbeat", ms(age), "ms", Neither)
			}
			break
		}
		kept = target
		beats := beats1 - beats0
		r.Figures = nil // only the largest step passed is reported
		r.add("sessions kept alive", float64(kept), "", Higher)
		r.add("heartbeats/s", beats/sz.heartbeatHold.Seconds(), "/s", Higher)
		if age > 0 {
			r.add("oldest acknowledged heartbeat", ms(age), "ms", Neither)
		}
		if beats > 0 {
			r.add("server CPU/heartbeat", float64(cpu.Microseconds())/beats, "µs", Lower)
		}
		// Per session, so that two systems that kept different numbers
		// compare; the total is shown as measured.
		r.add("server RSS", mib(rss), "MiB", Neither)
		r.add("server RSS per 1,000 sessions", mib(rss-start.RSS)*1000/float64(kept), "MiB", Lower)
	}
	if kept == 0 {
		r.add("sessions kept alive", 0, "", Higher)
	}
	r.add("TTL", ms(sz.heartbeatTTL), "ms", Neither)
	return []Result{r}, nil
}

// watchHeartbeats samples, until the returned function is called, how
// long ago the oldest acknowledged heartbeat of sessions was sent, and
// that function returns the most seen: how close the step came to an
// expiry (the server's at the TTL; Tenure's client gives a session up
// at 0.75×TTL). It samples every 100ms, or every microsecond per
// session when there are more than 100,000, so that it takes a few
// percent of a core at most. A figure for context, not compared: a
// loaded machine delays heartbeats as much as a slow server does.
func watchHeartbeats(sessions []session) (oldest func() time.Duration) {
	stop, done := make(chan struct{}), make(chan time.Duration, 1)
	every := max(100*time.Millisecond, time.Duration(len(sessions))*time.Microsecond)
	go func() {
		var most time.Duration
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			now := time.Now()
			for _, s := range sessions {
				most = max(most, now.Sub(s.lastAck()))
			}
			select {
			case <-stop:
				done <- most
				return
			case <-tick.C:
			}
		}
	}()
	return func() time.Duration {
		close(stop)
		return <-done
	}
}

// countLost counts the sessions their client found lost.
func countLost(sessions []session) int {
	n := 0
	for _, s := range sessions {
		select {
		case <-s.lost():
			n++
		default:
		}
	}
	return n
}

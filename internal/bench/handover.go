package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// --- 5: clean resign ---

// runResign has two campaigners, each with its own connection and
// session. The leader resigns once the other is waiting: the server (or
// the store) lists both, and 150ms more have passed. etcd's Campaign
// writes its key, reads, then watches from the revision it read; etcd
// puts a watch that starts at a past revision in a group it catches up
// every 100ms, so a delete in the watch's first 100ms is delivered up to
// 100ms late. A steadily waiting candidate, the case measured, has long
// been caught up. The figure is the time from just before Resign is
// called to the moment the other's Campaign returns. Then they swap.
func runResign(ctx context.Context, e *env) ([]Result, error) {
	r, err := e.resign(ctx)
	if err != nil {
		return nil, err
	}
	return []Result{r}, nil
}

func (e *env) resign(ctx context.Context) (Result, error) {
	var r Result
	ms, closeAll, err := e.fleet(ctx, 2, sessionTTL)
	if err != nil {
		return r, err
	}
	defer closeAll()
	els := []elector{ms[0].s.election("resign"), ms[1].s.election("resign")}
	if err := els[0].campaign(ctx, "a"); err != nil {
		return r, fmt.Errorf("campaign: %w", err)
	}
	u0, err := e.srv.Usage()
	if err != nil {
		return r, err
	}
	var lats latencies
	leader := 0
	end := time.Now().Add(e.sz.duration)
	for len(lats) < e.sz.resignMax && time.Now().Before(end) {
		next := 1 - leader
		elected, err := campaignInBackground(ctx, els[next], strconv.Itoa(next))
		if err != nil {
			return r, err
		}
		if err := waitCampaigners(ctx, ms[leader].c, "resign", 2); err != nil {
			return r, err
		}
		if !sleepUntil(ctx, time.Now().Add(150*time.Millisecond)) {
			return r, ctx.Err()
		}
		resigned := time.Now()
		if err := els[leader].resign(ctx); err != nil {
			return r, fmt.Errorf("resign: %w", err)
		}
		res := <-elected
		if res.err != nil {
			return r, fmt.Errorf("campaign: %w", res.err)
		}
		lats = append(lats, res.at.Sub(resigned))
		leader = next
	}
	u1, err := e.srv.Usage()
	if err != nil {
		return r, err
	}
	if err := els[leader].resign(ctx); err != nil {
		return r, fmt.Errorf("resign: %w", err)
	}
	r.addLatency("resign→next", mergeSorted(lats))
	r.add("handovers", float64(len(lats)), "", Neither)
	// The whole cycle: the next campaign, the polls that wait for it to
	// be listed, the idle 150ms (both servers' background ticks) and the
	// resign.
	r.addCPU(u1.CPU-u0.CPU, int64(len(lats)), "handover")
	return r, nil
}

type electedAt struct {
	at  time.Time
	err error
}

// campaignInBackground starts a campaign and returns when it ended.
func campaignInBackground(ctx context.Context, el elector, value string) (<-chan electedAt, error) {
	out := make(chan electedAt, 1)
	go func() {
		err := el.campaign(ctx, value)
		out <- electedAt{time.Now(), err}
	}()
	return out, nil
}

// waitCampaigners polls until n sessions campaign for name.
func waitCampaigners(ctx context.Context, c conn, name string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		got, err := c.campaigners(ctx, name)
		if err != nil {
			return fmt.Errorf("count campaigners: %w", err)
		}
		if got >= n {
			return nil
		}
		if !sleepUntil(ctx, time.Now().Add(time.Millisecond)) {
			return fmt.Errorf("waiting for %d campaigners (have %d): %w", n, got, ctx.Err())
		}
	}
}

// --- 6: holder crash ---

// errEarlyLeader is a safety violation: the next leader was elected less
// than a TTL after the crashed holder's last acknowledged heartbeat.
var errEarlyLeader = errors.New("next leader elected before the crashed holder's TTL ran out")

// runCrash has a holder lead an election and a second campaigner wait,
// each with its own connection and a session of TTL 5s; then the holder
// "crashes": its connections are closed without ending its session
// (Tenure's Client.Close does not close sessions; closing etcd's client
// stops keep-alives without revoking the lease), so the server must
// expire it. The figure is the time from the crash to the moment the
// waiter's Campaign returns.
//
// It must not be less than the TTL after the holder's last acknowledged
// heartbeat's send time (which the holder may count on for its
// validity), or two leaders could overlap: that is reported as an
// error. From the crash itself the wait can legitimately be shorter than
// the TTL, by up to one heartbeat interval.
func runCrash(ctx context.Context, e *env) ([]Result, error) {
	var r Result
	ttl := e.sz.crashTTL
	var fromCrash, fromAck latencies
	for i := range e.sz.crashIterations {
		name := fmt.Sprintf("crash-%d", i)
		hc, err := e.dial(ctx, dialOptions{trackAcks: true})
		if err != nil {
			return nil, err
		}
		crashed := false
		defer func() {
			if !crashed {
				_ = hc.close()
			}
		}()
		hs, err := hc.session(ctx, ttl)
		if err != nil {
			return nil, fmt.Errorf("open the holder's session: %w", err)
		}
		if err := hs.election(name).campaign(ctx, "holder"); err != nil {
			return nil, fmt.Errorf("holder's campaign: %w", err)
		}
		ms, closeWaiter, err := e.fleet(ctx, 1, ttl)
		if err != nil {
			return nil, err
		}
		waiter := ms[0].s.election(name)
		elected, err := campaignInBackground(ctx, waiter, "waiter")
		if err != nil {
			closeWaiter()
			return nil, err
		}
		if err := waitCampaigners(ctx, ms[0].c, name, 2); err != nil {
			closeWaiter()
			return nil, err
		}
		// Let a heartbeat or two pass, as a holder would have.
		if !sleepUntil(ctx, time.Now().Add(ttl/2)) {
			closeWaiter()
			return nil, ctx.Err()
		}
		ack := hs.lastAck()
		crash := time.Now()
		_ = hc.close()
		crashed = true
		var res electedAt
		select {
		case res = <-elected:
		case <-time.After(4 * ttl):
			res.err = fmt.Errorf("no new leader %v after the crash", 4*ttl)
		}
		closeWaiter()
		if res.err != nil {
			return nil, fmt.Errorf("waiter's campaign: %w", res.err)
		}
		fromCrash = append(fromCrash, res.at.Sub(crash))
		fromAck = append(fromAck, res.at.Sub(ack))
		if d := res.at.Sub(ack); d < ttl {
			return nil, fmt.Errorf("%w: %v after it, TTL %v", errEarlyLeader, d.Round(time.Millisecond), ttl)
		}
	}
	fc, fa := mergeSorted(fromCrash), mergeSorted(fromAck)
	r.add("crash→next", ms(percentile(fc, 50)), "ms", Lower)
	r.add("last acknowledged heartbeat→next (≥ TTL)", ms(fa[0]), "ms", Neither)
	r.add("TTL", ms(ttl), "ms", Neither)
	return []Result{r}, nil
}

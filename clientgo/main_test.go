package clientgo_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/server"
)

// TestMain runs the elector child when the process test started this
// binary as one (see electorMain), and otherwise the tests, failing the
// package if any leaves a goroutine behind: electors, heartbeat loops,
// grant monitors, watches and the fenced resource must all end.
func TestMain(m *testing.M) {
	if os.Getenv(envIdentity) != "" {
		os.Exit(electorMain())
	}
	// The electors log through klog; the tests say what went wrong.
	klog.SetLogger(logr.Discard())
	goleak.VerifyTestMain(m)
}

// Timing shared by the tests' electors: client-go's three durations as
// small as its rules allow for a session TTL of 2s, the server's
// minimum.
const (
	sessionTTL    = 2 * time.Second
	leaseDuration = 2 * time.Second
	renewDeadline = 1500 * time.Millisecond
	retryPeriod   = 300 * time.Millisecond
	// waitLimit bounds every wait for something the tests expect to
	// happen: far above how long it takes, so a slow machine does not
	// fail them, but a test that hangs still stops by itself.
	waitLimit = 20 * time.Second
)

// startServer runs a single Tenure node on 127.0.0.1 free ports for the
// test and returns its address.
func startServer(t testing.TB) string {
	t.Helper()
	return testserver.Start(t, server.DefaultLimits())
}

func newClient(t testing.TB, addr string) *client.Client {
	t.Helper()
	c, err := client.New(context.Background(), []string{addr},
		client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newSession opens a session with a 2s TTL; the test's cleanup closes it.
func newSession(t testing.TB, c *client.Client, identity string) *client.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	s, err := c.NewSession(ctx, client.WithTTL(sessionTTL), client.WithIdentity(identity))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// electorConfig is the tests' LeaderElectionConfig for lock.
func electorConfig(lock resourcelock.Interface, cb leaderelection.LeaderCallbacks) leaderelection.LeaderElectionConfig {
	return leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   leaseDuration,
		RenewDeadline:   renewDeadline,
		RetryPeriod:     retryPeriod,
		ReleaseOnCancel: true,
		Name:            lock.Identity(),
		Callbacks:       cb,
	}
}

// leaseLog records the lease events of one namespace from the moment it
// starts, to tell how each grant ended. The test's cleanup stops it.
type leaseLog struct {
	mu     sync.Mutex // guards events
	events []client.LeaseEvent
	done   chan struct{} // closed when the watch has ended
}

func watchLeases(t testing.TB, c *client.Client, namespace string) *leaseLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &leaseLog{done: make(chan struct{})}
	ch := c.WatchLeases(ctx, client.ListOptions{Namespace: namespace}, 0)
	go func() {
		defer close(l.done)
		for ev := range ch {
			l.mu.Lock()
			l.events = append(l.events, ev)
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-l.done
	})
	return l
}

// end waits for the event that ended grant token of lease name and
// returns its type: "released", "expired" or "revoked".
func (l *leaseLog) end(t testing.TB, name string, token int64) string {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		i := slices.IndexFunc(l.events, func(ev client.LeaseEvent) bool {
			return ev.Name == name && ev.Token == token && slices.Contains([]string{"released", "expired", "revoked"}, ev.Type)
		})
		var typ string
		if i >= 0 {
			typ = l.events[i].Type
		}
		l.mu.Unlock()
		if typ != "" {
			return typ
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no event ended grant %d of %s within %v", token, name, waitLimit)
	return ""
}

package clientgo_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/clientgo"
	"github.com/tenurehq/tenure/fence"
)

// The process test starts this test binary as electors; these variables
// tell an elector who it is and where the server and the resource are.
const (
	envIdentity = "CLIENTGO_TEST_ELECTOR"
	envTenure   = "CLIENTGO_TEST_TENURE"
	envResource = "CLIENTGO_TEST_RESOURCE"
	// electorLease is the lease, in the default namespace, they elect on.
	electorLease = "controller"
	// writeEvery is how often a leader writes to the resource.
	writeEvery = 50 * time.Millisecond
	// childLifetime ends an elector that outlives its test, whatever
	// happened to the parent.
	childLifetime = 2 * time.Minute
)

// electorMain is an elector process: client-go's leaderelection.RunOrDie
// on a clientgo.Lock, campaigning again with a new session and Lock
// after each loss, until SIGTERM. While it leads it writes to the
// resource every writeEvery with the token it was elected with, trusting
// the elector's belief that it leads and nothing else: the resource's
// check is all that keeps a deposed leader's writes out. When it stops
// leading it sends one late write with that token. On SIGTERM it stops
// writing first, then cancels the elector, which releases the lease
// (ReleaseOnCancel), and exits 0.
func electorMain() int {
	id, addr, url := os.Getenv(envIdentity), os.Getenv(envTenure), os.Getenv(envResource)
	logger := log.New(os.Stderr, id+" ", log.Lmicroseconds)
	time.AfterFunc(childLifetime, func() {
		logger.Print("lived too long; exiting")
		os.Exit(3)
	})
	sig, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stopSignals()

	c, err := client.New(context.Background(), []string{addr},
		client.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil)).With("elector", id)))
	if err != nil {
		logger.Print(err)
		return 1
	}
	defer c.Close()
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	send := func(tok client.Token, late bool) {
		req, err := http.NewRequest(http.MethodPost, url, nil)
		if err != nil {
			logger.Print(err)
			return
		}
		req.Header.Set(fence.Header, fence.Format(tok))
		req.Header.Set(headerIdentity, id)
		if late {
			req.Header.Set(headerLate, "1")
		}
		resp, err := hc.Do(req)
		if err != nil {
			logger.Printf("write with %v: %v", tok, err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			logger.Printf("write with %v (late %v): %s", tok, late, resp.Status)
		}
	}

	// work is held by a leader while it writes. On SIGTERM the elector
	// is cancelled only once the writing has stopped: client-go releases
	// the lease without waiting for OnStartedLeading.
	var work sync.Mutex
	run, stopRun := context.WithCancel(context.Background())
	go func() {
		<-sig.Done()
		work.Lock()
		stopRun()
		work.Unlock()
	}()

	for run.Err() == nil {
		s, err := c.NewSession(run, client.WithTTL(sessionTTL), client.WithIdentity(id))
		if err != nil {
			logger.Printf("opening a session: %v", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		lock := clientgo.New(s, "", electorLease)
		var mu sync.Mutex // guards led
		var led client.Token
		leaderelection.RunOrDie(run, electorConfig(lock, leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				work.Lock()
				defer work.Unlock()
				if sig.Err() != nil {
					return
				}
				tok, valid := lock.Token()
				logger.Printf("leading with %v (valid %v)", tok, valid)
				mu.Lock()
				led = tok
				mu.Unlock()
				tick := time.NewTicker(writeEvery)
				defer tick.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-sig.Done():
						return
					case <-tick.C:
						send(tok, false)
					}
				}
			},
			OnStoppedLeading: func() {
				mu.Lock()
				tok := led
				mu.Unlock()
				if tok.Token != 0 {
					logger.Printf("stopped leading with %v", tok)
					send(tok, true)
				}
			},
		}))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.Close(ctx); err != nil {
			logger.Printf("closing the session: %v", err)
		}
		cancel()
	}
	fmt.Fprintln(os.Stderr, id, "exiting")
	return 0
}

package clientgo_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/clientgo"
	"github.com/tenurehq/tenure/fence"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/server"
)

// A controller that elects its leader with client-go changes one
// constructor: a Tenure session and clientgo.New instead of
// resourcelock.New(resourcelock.LeasesResourceLock, ...). The leader
// fences its writes with the lease's token.
func ExampleNew() {
	addr, stop, err := testserver.Open(server.DefaultLimits()) // in production: your cluster's endpoints
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tenure, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer tenure.Close()

	s, err := tenure.NewSession(ctx, client.WithIdentity("replica-1"), client.WithTTL(15*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(context.Background())
	lock := clientgo.New(s, "default", "controller")

	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				tok, _ := lock.Token()
				fmt.Println("leading; writes carry", fence.Header+":", tok)
				// Every request through hc carries the token, and none
				// is sent once the grant may be lost.
				hc := &http.Client{Transport: fence.Transport(nil, lock)}
				_ = hc
				cancel() // done: stop, then let the elector release
			},
			OnStoppedLeading: func() { fmt.Println("stopped leading") },
		},
	})
	// Output:
	// leading; writes carry Tenure-Fence: default/controller:2
	// stopped leading
}

package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testserver"
	"github.com/tenurehq/tenure/server"
)

// exampleServer starts a single Tenure node for an example and returns
// its address, where a program would name its cluster's endpoints. The
// caller should call stop when finished; it stops the node and removes
// its data.
func exampleServer() (addr string, stop func()) {
	addr, stop, err := testserver.Open(server.DefaultLimits())
	if err != nil {
		log.Fatal(err)
	}
	return addr, stop
}

// A cron job that runs on several machines but must run on one at a time
// takes a lock first. The token fences what the job writes; Valid says
// whether the lock is still certainly held.
func ExampleMutex() {
	addr, stop := exampleServer() // in production: your cluster's endpoints
	defer stop()

	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	m := s.Mutex("nightly-report")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	tok, valid := m.Token()
	fmt.Println("token:", tok, "valid:", valid)
	// Run the job under m.Context(), which ends if the lock may be lost,
	// and pass tok to every resource the job writes to.
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("valid after unlock:", m.Valid())
	// Output:
	// token: default/nightly-report:2 valid: true
	// valid after unlock: false
}

// Two sessions compete for a lock: TryLock does not wait, and the token
// of the next grant is higher than the last.
func ExampleMutex_TryLock() {
	addr, stop := exampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	alice, err := c.NewSession(ctx, client.WithIdentity("alice"))
	if err != nil {
		log.Fatal(err)
	}
	defer alice.Close(ctx)
	bob, err := c.NewSession(ctx, client.WithIdentity("bob"))
	if err != nil {
		log.Fatal(err)
	}
	defer bob.Close(ctx)

	a, b := alice.Mutex("payments-batch"), bob.Mutex("payments-batch")
	if err := a.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	err = b.TryLock(ctx)
	fmt.Println("bob locked out:", errors.Is(err, client.ErrLocked))
	first, _ := a.Token()
	if err := a.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := b.TryLock(ctx); err != nil {
		log.Fatal(err)
	}
	next, _ := b.Token()
	fmt.Println("bob's token is higher:", next.Token > first.Token)
	if err := b.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// bob locked out: true
	// bob's token is higher: true
}

// A resource that is written to by lock holders asks the server whether
// the token it was handed is still the holder's before it accepts a
// write. Package fence does this for HTTP and Connect servers.
func ExampleClient_Validate() {
	addr, stop := exampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithIdentity("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	m := s.Mutex("invoice-run")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	tok, _ := m.Token() // what the holder sends along with its writes
	res, err := c.Validate(ctx, tok)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("while held:", res.Valid, res.Holder)
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	res, err = c.Validate(ctx, tok)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after unlock:", res.Valid)
	// Output:
	// while held: true worker-1
	// after unlock: false
}

// One of several schedulers campaigns; the leader publishes its address,
// which anyone can read with Leader.
func ExampleSession_Election() {
	addr, stop := exampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithIdentity("scheduler-a"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	e := s.Election("scheduler")
	if err := e.Campaign(ctx, "10.0.0.7:8080"); err != nil {
		log.Fatal(err)
	}
	l, err := e.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	mine, leading := e.Token()
	fmt.Println("leader:", l.Identity, l.Value, "is me:", leading && l.Token == mine.Token)
	if err := e.Proclaim(ctx, "10.0.0.8:8080"); err != nil {
		log.Fatal(err)
	}
	l, _ = e.Leader(ctx)
	fmt.Println("moved to:", l.Value)
	if err := e.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = e.Leader(ctx)
	fmt.Println("after resigning:", errors.Is(err, client.ErrNoLeader))
	// Output:
	// leader: scheduler-a 10.0.0.7:8080 is me: true
	// moved to: 10.0.0.8:8080
	// after resigning: true
}

// RunElection keeps a process campaigning: it calls OnStartedLeading when
// elected, with a context that ends when leadership may be lost, and
// campaigns again after a loss. Cancelling its context hands leadership
// to the next candidate at once, and RunElection returns nil.
func ExampleRunElection() {
	addr, stop := exampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithIdentity("scheduler-a"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	ctx, cancel := context.WithCancel(ctx)
	elected := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- client.RunElection(ctx, s, "scheduler", client.Callbacks{
			OnStartedLeading: func(ctx context.Context) {
				fmt.Println("started leading")
				close(elected)
				<-ctx.Done() // schedule until leadership may be lost
			},
			OnStoppedLeading: func() { fmt.Println("stopped leading") },
		}, client.WithValue("10.0.0.7:8080"))
	}()
	<-elected
	cancel() // e.g. on SIGTERM: hand over, don't wait for a TTL
	fmt.Println("RunElection returned:", <-done)
	// Output:
	// started leading
	// stopped leading
	// RunElection returned: <nil>
}

// The lock from the book, built on compare-and-swap: a key that is
// "unlocked" or names its owner.
func ExampleKV_CompareAndSwap() {
	addr, stop := exampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	kv := c.KV()

	if _, err := kv.Put(ctx, "my-lock", "unlocked"); err != nil {
		log.Fatal(err)
	}
	got, err := kv.CompareAndSwap(ctx, "my-lock", client.ValueIs("unlocked"), "alice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("alice swapped:", got.Value)

	_, err = kv.CompareAndSwap(ctx, "my-lock", client.ValueIs("unlocked"), "bob")
	var failed *client.CompareFailedError
	if errors.Is(err, client.ErrCompareFailed) && errors.As(err, &failed) {
		fmt.Println("bob failed: compare failed; held by", failed.Current.Value)
	}

	// Alice unlocks only if she still holds it.
	got, err = kv.CompareAndSwap(ctx, "my-lock", client.ValueIs("alice"), "unlocked")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("alice unlocked:", got.Value)
	// Output:
	// alice swapped: alice
	// bob failed: compare failed; held by alice
	// alice unlocked: unlocked
}

// A semaphore of capacity 2 lets two sessions in at once, each with its
// own token; the third waits or, with TryAcquire, is turned away.
func ExampleSemaphore() {
	addr, stop := exampleServer()
	defer stop()

	ctx := context.Background()
	c, err := client.New(ctx, []string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	var slots []*client.Semaphore
	for _, id := range []string{"render-1", "render-2", "render-3"} {
		s, err := c.NewSession(ctx, client.WithIdentity(id))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close(ctx)
		slots = append(slots, s.Semaphore("render-slots", 2))
	}

	for i, slot := range slots {
		err := slot.TryAcquire(ctx)
		switch {
		case err == nil:
			fmt.Printf("render-%d got a slot\n", i+1)
		case errors.Is(err, client.ErrLocked):
			fmt.Printf("render-%d: all slots taken\n", i+1)
		default:
			log.Fatal(err)
		}
	}
	t0, _ := slots[0].Token()
	t1, _ := slots[1].Token()
	fmt.Println("distinct tokens:", t0.Token != t1.Token)
	if err := slots[0].Release(ctx); err != nil {
		log.Fatal(err)
	}
	if err := slots[2].Acquire(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("render-3 got the freed slot:", slots[2].Valid())
	// Output:
	// render-1 got a slot
	// render-2 got a slot
	// render-3: all slots taken
	// distinct tokens: true
	// render-3 got the freed slot: true
}

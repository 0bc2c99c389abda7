package client_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
)

func TestRWMutexReadersShareWritersExclude(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	readers := make([]*client.RWMutex, 3)
	for i := range readers {
		readers[i] = newSession(t, c, client.WithTTL(2*time.Second)).RWMutex("rw")
	}
	writer := newSession(t, c, client.WithTTL(2*time.Second)).RWMutex("rw")

	// Readers in different sessions hold it together.
	for i, r := range readers {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		err := r.RLock(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("reader %d: got = %v while %d others read, expected: shared", i, err, i)
		}
		if !r.Valid() || tokenOf(r) == 0 {
			t.Fatalf("reader %d: got = valid %v token %d, expected: valid with a token", i, r.Valid(), tokenOf(r))
		}
	}
	if err := writer.TryLock(ctx); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("got = writer TryLock %v while reading, expected: ErrLocked", err)
	}
	wrote := make(chan error, 1)
	go func() { wrote <- writer.Lock(ctx) }()
	for i, r := range readers {
		select {
		case err := <-wrote:
			t.Fatalf("got = writer granted (%v) with %d readers left, expected: waiting", err, len(readers)-i)
		case <-time.After(50 * time.Millisecond):
		}
		if err := r.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("got = writer waiting 5s after the readers left, expected: granted")
	}
	// A reader waits for the writer.
	read := make(chan error, 1)
	go func() { read <- readers[0].RLock(ctx) }()
	select {
	case err := <-read:
		t.Fatalf("got = reader granted (%v) while a writer holds, expected: waiting", err)
	case <-time.After(200 * time.Millisecond):
	}
	wtoken := tokenOf(writer)
	if err := writer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if tokenOf(readers[0]) <= wtoken {
		t.Fatalf("got = reader token %d, expected: above the writer's %d", tokenOf(readers[0]), wtoken)
	}
	if err := readers[0].RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRWMutexNoWriterStarvation: readers in three sessions re-acquire
// in a loop so that the lock is never free of readers, and two writers
// want it too. The server's FIFO queue makes readers that come after a
// waiting writer wait for it, so the writers get in within a bound;
// meanwhile no writer ever overlaps a reader or another writer.
func TestRWMutexNoWriterStarvation(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const (
		readerSessions = 3
		writerSessions = 2
		writerRounds   = 5
		maxWriterWait  = 5 * time.Second
	)
	var (
		errs       errorList
		readersIn  atomic.Int32
		writersIn  atomic.Int32
		maxReaders atomic.Int32
		reads      atomic.Int32
		// askedWhileRead counts writer Locks asked while readers held the
		// lock: the case a reader-preferring lock would starve.
		askedWhileRead atomic.Int32
		stop           = make(chan struct{})
	)
	var readersWG sync.WaitGroup
	for i := range readerSessions {
		rw := newSession(t, c, client.WithTTL(2*time.Second)).RWMutex("stream")
		readersWG.Go(func() {
			// Stagger the readers so that their holds overlap.
			time.Sleep(time.Duration(i) * 10 * time.Millisecond)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := rw.RLock(ctx); err != nil {
					errs.add("reader %d: RLock: %v", i, err)
					return
				}
				n := readersIn.Add(1)
				for m := maxReaders.Load(); n > m && !maxReaders.CompareAndSwap(m, n); m = maxReaders.Load() {
				}
				if w := writersIn.Load(); w != 0 {
					errs.add("got = a reader in with %d writers, expected: none", w)
				}
				reads.Add(1)
				time.Sleep(30 * time.Millisecond)
				readersIn.Add(-1)
				if err := rw.RUnlock(ctx); err != nil {
					errs.add("reader %d: RUnlock: %v", i, err)
					return
				}
			}
		})
	}
	// Wait until the readers are streaming.
	for reads.Load() < 2*readerSessions && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}

	var writersWG sync.WaitGroup
	var mu sync.Mutex
	var waits []time.Duration
	for i := range writerSessions {
		rw := newSession(t, c, client.WithTTL(2*time.Second)).RWMutex("stream")
		writersWG.Go(func() {
			for range writerRounds {
				readsBefore := reads.Load()
				if readersIn.Load() > 0 {
					askedWhileRead.Add(1)
				}
				asked := time.Now()
				wctx, wcancel := context.WithTimeout(ctx, maxWriterWait)
				err := rw.Lock(wctx)
				wcancel()
				if err != nil {
					errs.add("writer %d: got = %v, expected: granted within %v while readers stream", i, err, maxWriterWait)
					return
				}
				waited := time.Since(asked)
				if w := writersIn.Add(1); w != 1 {
					errs.add("got = %d writers in, expected: 1", w)
				}
				if r := readersIn.Load(); r != 0 {
					errs.add("got = a writer in with %d readers, expected: none", r)
				}
				mu.Lock()
				waits = append(waits, waited)
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
				writersIn.Add(-1)
				if err := rw.Unlock(ctx); err != nil {
					errs.add("writer %d: Unlock: %v", i, err)
					return
				}
				// Let the readers have a go, so the next Lock arrives
				// while they hold it.
				for reads.Load() < readsBefore+readerSessions && ctx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	writersWG.Wait()
	readsDuringWriters := reads.Load()
	close(stop)
	readersWG.Wait()
	errs.check(t)
	t.Logf("%d reads, at most %d readers at once, %d writer Locks asked while reading, writer waits %v", readsDuringWriters, maxReaders.Load(), askedWhileRead.Load(), waits)
	if got := len(waits); got != writerSessions*writerRounds {
		t.Fatalf("got = %d writer grants, expected: %d", got, writerSessions*writerRounds)
	}
	if got := askedWhileRead.Load(); got < writerSessions*writerRounds/2 {
		t.Fatalf("got = %d of %d writer Locks asked while readers held it, expected: at least half", got, writerSessions*writerRounds)
	}
	if got := maxReaders.Load(); got < 2 {
		t.Fatalf("got = at most %d readers at once, expected: readers overlapping", got)
	}
}

package server

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/internal/testnet"
)

func TestLimitsThatCannotWorkAreRefusedNamingTheField(t *testing.T) {
	cases := []struct {
		name   string
		change func(*Limits)
		want   string
	}{
		{"a library user who sets one field leaves the others zero", func(l *Limits) { *l = Limits{MaxTTL: time.Hour} }, "MaxNameBytes is 0; it must be at least 1 (--max-name-bytes)"},
		{"a request size too small for any request", func(l *Limits) { l.MaxRequestBytes = 10 }, "MaxRequestBytes is 10; it must be at least 1024 (--max-request-bytes)"},
		{"an etcd request size too small for any request", func(l *Limits) { l.EtcdMaxRequestBytes = 100 }, "EtcdMaxRequestBytes is 100; it must be between 1024 and 8388608 (8 MiB) (--etcd-max-request-bytes)"},
		{"an etcd answer cap too small for any answer", func(l *Limits) { l.EtcdMaxResponseBytes = 0 }, "EtcdMaxResponseBytes is 0; it must be between 1024 and 2147483647 (gRPC's largest message) (--etcd-max-response-bytes)"},
		{"an etcd request size past what a log entry may safely hold", func(l *Limits) { l.EtcdMaxRequestBytes = 64 << 20 }, "EtcdMaxRequestBytes is 67108864; it must be between 1024 and 8388608 (8 MiB) (--etcd-max-request-bytes)"},
		{"a negative read timeout", func(l *Limits) { l.RequestReadTimeout = -time.Second }, "RequestReadTimeout is -1s"},
		{"no minimum TTL", func(l *Limits) { l.MinTTL = 0 }, "MinTTL is 0s; it must be positive (--min-ttl)"},
		{"a maximum TTL under the minimum", func(l *Limits) { l.MaxTTL = time.Second }, "MaxTTL is 1s; it must be at least MinTTL 2s (--max-ttl)"},
		{"a default TTL outside the range", func(l *Limits) { l.DefaultTTL = time.Second }, "DefaultTTL is 1s; it must be within MinTTL 2s and MaxTTL 24h0m0s (--default-ttl)"},
		{"no semaphore capacity", func(l *Limits) { l.MaxCapacity = 0 }, "MaxCapacity is 0; it must be at least 1 (--max-capacity)"},
		{"negative label count", func(l *Limits) { l.MaxLabels = -1 }, "MaxLabels is -1"},
		{"a negative cap on parked waits", func(l *Limits) { l.MaxWaits = -1 }, "MaxWaits is -1; it must be 0 (no limit) or more (--max-waits)"},
		{"a negative cap on open watches", func(l *Limits) { l.MaxWatches = -5 }, "MaxWatches is -5; it must be 0 (no limit) or more (--max-watches)"},
		{"no watch history", func(l *Limits) { l.WatchHistory = 0 }, "WatchHistory is 0; it must be at least 1 (--watch-history)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := DefaultLimits()
			c.change(&l)
			err := l.Validate()
			if !errors.Is(err, ErrInvalidLimits) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got = %v, expected: ErrInvalidLimits containing %q", err, c.want)
			}
		})
	}
	if err := DefaultLimits().Validate(); err != nil {
		t.Fatalf("DefaultLimits: got = %v, expected: valid", err)
	}
	zeroes := DefaultLimits()
	zeroes.MaxSessionsPerIdentity, zeroes.MaxWaitersPerLease, zeroes.RequestReadTimeout = 0, 0, 0
	zeroes.MaxWaits, zeroes.MaxWatches = 0, 0
	if err := zeroes.Validate(); err != nil {
		t.Fatalf("zero meaning no limit: got = %v, expected: valid", err)
	}
}

func TestOpenRefusesLimitsThatCannotWork(t *testing.T) {
	ln := testnet.Listen(t)
	defer ln.Close()
	cfg := Config{Listener: ln, Limits: Limits{MaxNameBytes: 64}}
	cfg.Raft.DataDir = t.TempDir()
	if _, err := Open(cfg); !errors.Is(err, ErrInvalidLimits) {
		t.Fatalf("got = %v, expected: ErrInvalidLimits before anything starts", err)
	}
}

// Package testnet is the one place tests find addresses: every test server
// binds 127.0.0.1, never another interface, on a port the kernel chose.
package testnet

import (
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Listen binds 127.0.0.1 on a free port. The caller closes it (a server
// that takes it over closes it on its own Close).
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on 127.0.0.1: %v", err)
	}
	return ln
}

// FreeAddr returns a 127.0.0.1 address nothing listens on: free a moment
// ago, so fit for an address that must be known before its server starts
// (a raft peer address that must survive restarts) or that must refuse
// connections (a dead endpoint).
func FreeAddr() (string, error) {
	ln, err := listenBelowEphemeral()
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// listenBelowEphemeral binds 127.0.0.1 on a random port below the
// kernel's ephemeral range. A port the kernel chose for ":0" comes from
// that range, the one it also takes the local ports of outgoing
// connections from: once its listener closed, any connection of any
// process could take it before the server that was meant to rebind it
// (CI: a restarted raft node's "bind: address already in use"). Below the
// range only another explicit pick can, and a random one rarely does.
func listenBelowEphemeral() (net.Listener, error) {
	const lowest = 10000
	if top := ephemeralLow(); top > lowest+1000 {
		for range 100 {
			port := lowest + rand.IntN(top-lowest)
			if ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				return ln, nil
			}
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// ephemeralLow is the first port of Linux's ephemeral range, or 32768
// (below every other system's) where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 32768
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 32768
	}
	return low
}

// Free is FreeAddr for a test, which it fails on error.
func Free(t testing.TB) string {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatalf("find a free port on 127.0.0.1: %v", err)
	}
	return addr
}

// FreeN is n distinct free addresses: each is held until all are found,
// so that the kernel cannot hand the same port out twice (a cluster whose
// two nodes were given one peer port failed to form).
func FreeN(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for range n {
		ln, err := listenBelowEphemeral()
		if err != nil {
			t.Fatalf("find a free port on 127.0.0.1: %v", err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

// Echo serves an echo (every byte written back) on 127.0.0.1 until the
// test ends, and returns its address: the far end of a proxy or a delayed
// link under test.
func Echo(t testing.TB) string {
	t.Helper()
	ln := Listen(t)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	return ln.Addr().String()
}

package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
	"github.com/tenurehq/tenure/internal/testnet"
)

// serveUntilReady runs `tenure serve` in process with args on free
// 127.0.0.1 ports, waits for it to be ready, and returns its API address;
// it is stopped, as by a signal, when the test ends.
func serveUntilReady(t *testing.T, args ...string) string {
	t.Helper()
	addrs := testnet.FreeN(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	root := NewRootCommand()
	root.SetArgs(append([]string{"serve", "--listen", addrs[0], "--peer-listen", addrs[1], "--data-dir", t.TempDir()}, args...))
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	stopped := false // before it was ready, reported then
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !stopped {
			t.Errorf("serve after a signal: got = %v, expected: a clean stop", err)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-done:
			stopped = true
			done <- err // for the cleanup
			t.Fatalf("serve %q: got = %v before it was ready, expected: a node serving", args, err)
		default:
		}
		if resp, err := http.Get("http://" + addrs[0] + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addrs[0]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve %q: not ready after 20s", args)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nodeEngine asks the node at addr which engine it runs, as curl would.
func nodeEngine(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Post("http://"+addr+tenurev1connect.ClusterServiceStatusProcedure, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Engine string }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.Engine
}

// A node runs the etcd raft engine. The hashicorp/raft engine's timeouts
// (--heartbeat-timeout, --leader-lease-timeout, --snapshot-interval)
// still start a node, from the command line or the config file: a config
// written for an older build keeps working. (pflag prints their
// deprecation warning to the process's stderr, which a test in process
// does not see.)
func TestServeRunsTheEtcdRaftEngineAndTakesTheOldTimeouts(t *testing.T) {
	tests := []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"no flags", func(*testing.T) []string { return nil }},
		{"the old flags", func(*testing.T) []string {
			return []string{"--heartbeat-timeout", "1s", "--leader-lease-timeout", "500ms", "--snapshot-interval", "1m"}
		}},
		{"the old config keys", func(t *testing.T) []string {
			return []string{"--config", writeConfig(t, "heartbeat-timeout: 1s\nleader-lease-timeout: 500ms\nsnapshot-interval: 1m\n")}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := serveUntilReady(t, tt.args(t)...)
			if got := nodeEngine(t, addr); got != "etcd" {
				t.Fatalf("engine: got = %q, expected: etcd", got)
			}
		})
	}
}

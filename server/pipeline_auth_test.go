package server

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/api/framing"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/internal/certs"
)

// upgradeTLS asks as for a pipeline over a new TLS connection, as the Go
// client does, with credentials as authServer.http names them ("token:X",
// "cert:FILE" or ""). It returns the server's answer and, after a 101,
// the upgraded connection.
func upgradeTLS(t *testing.T, as *authServer, credentials string) (*http.Response, *upgradePipe) {
	t.Helper()
	var cert, key string
	if name, ok := strings.CutPrefix(credentials, "cert:"); ok {
		cert, key = filepath.Join(as.dir, name+".pem"), filepath.Join(as.dir, name+"-key.pem")
	}
	cfg, err := certs.ClientConfig(filepath.Join(as.dir, "ca.pem"), cert, key)
	if err != nil {
		t.Fatal(err)
	}
	cfg.NextProtos = []string{"http/1.1"} // an upgrade is HTTP/1.1's
	conn, err := tls.Dial("tcp", strings.TrimPrefix(as.url, "https://"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	auth := ""
	if name, ok := strings.CutPrefix(credentials, "token:"); ok {
		tok, known := as.tokens[name]
		if !known {
			tok = name
		}
		auth = "Authorization: Bearer " + tok + "\r\n"
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: tenure\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%sContent-Length: 0\r\n\r\n", framing.Path, framing.Protocol, auth)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Time{})
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return resp, nil
	}
	return resp, &upgradePipe{conn: conn, r: framing.NewReader(br, 1<<20), w: framing.NewWriter(conn)}
}

// TestPipelineUpgradeIsRefusedBeforeTheConnectionIsTakenOver: with a
// policy, the upgrade answers as the NDJSON endpoints do — 401 without
// valid credentials, 403 for a principal the policy does not know, with
// the reason header — and audits it with the caller's address; nobody
// gets an upgraded connection to hold without being somebody.
func TestPipelineUpgradeIsRefusedBeforeTheConnectionIsTakenOver(t *testing.T) {
	as := startAuthServer(t)
	if err := certs.Client(as.dir, "stranger", "stranger", certs.Options{}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, credentials string
		status            int
		reason            api.Reason
		code              connect.Code
		principal         string
	}{
		{"no credentials", "", http.StatusUnauthorized, api.ReasonUnauthenticated, connect.CodeUnauthenticated, ""},
		{"a token nobody was given", "token:not-a-token", http.StatusUnauthorized, api.ReasonUnauthenticated, connect.CodeUnauthenticated, ""},
		{"an expired token", "token:retired", http.StatusUnauthorized, api.ReasonUnauthenticated, connect.CodeUnauthenticated, ""},
		{"a certificate of a principal the policy does not know", "cert:stranger", http.StatusForbidden, api.ReasonPermissionDenied, connect.CodePermissionDenied, "stranger"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, pipe := upgradeTLS(t, as, c.credentials)
			if pipe != nil {
				t.Fatalf("got = 101 and an upgraded connection, expected: %d", c.status)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status || api.Reason(resp.Header.Get(api.ErrorHeader)) != c.reason {
				t.Errorf("got = %s (%s %q), expected: %d (%s)", resp.Status, api.ErrorHeader, resp.Header.Get(api.ErrorHeader), c.status, c.reason)
			}
			if !strings.HasPrefix(string(body), c.code.String()+": ") {
				t.Errorf("body got = %q, expected: the reason, code first", body)
			}
		})
	}
	lines := auditLines(t, as.logs.String(), func(l map[string]string) bool { return l["action"] == framing.Path })
	if len(lines) != len(cases) {
		t.Fatalf("audit lines for %s got = %d, expected: %d", framing.Path, len(lines), len(cases))
	}
	for i, l := range lines {
		if l["outcome"] != "denied" || !strings.HasPrefix(l["reason"], cases[i].code.String()+": ") || !strings.HasPrefix(l["remote"], "127.0.0.1:") || l["principal"] != cases[i].principal {
			t.Errorf("audit line %d got = %v, expected: denied, %s, principal %q, a remote address", i, l, cases[i].code, cases[i].principal)
		}
	}

	resp, pipe := upgradeTLS(t, as, "token:team-a")
	if pipe == nil {
		t.Fatalf("team-a's upgrade: got = %s, expected: 101", resp.Status)
	}
	pt := &pipeT{upgradePipe: pipe, t: t}
	pt.pingPong(1)
}

// TestPipelineIdleConnectionIsClosedWithGoAway: an upgraded connection
// with nothing in flight is closed after the idle timeout with a GoAway
// naming the last request read, pings notwithstanding; one with a wait
// in flight stays open past it, and its clock starts when the wait is
// answered.
func TestPipelineIdleConnectionIsClosedWithGoAway(t *testing.T) {
	limits := testLimits()
	limits.PipelineIdleTimeout = 300 * time.Millisecond
	ts := startServer(t, t.TempDir(), limits)

	t.Run("pings do not keep it open", func(t *testing.T) {
		p := openPipe(t, ts)
		p.roundTrip(&tenurev1.PipelineRequest{Id: 1, Op: &tenurev1.PipelineRequest_Get{Get: &tenurev1.GetRequest{Key: "k"}}})
		closed := make(chan error, 1)
		go func() {
			// A peer pinging to hold the connection, as in the attack.
			for {
				if err := p.send(&tenurev1.PipelineRequest{Op: &tenurev1.PipelineRequest_Ping{Ping: &tenurev1.Ping{}}}); err != nil {
					closed <- err
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		for giveUp := time.Now().Add(20 * time.Second); ; {
			resp, err := p.readErr()
			if err != nil {
				t.Fatalf("got = %v before any GoAway, expected: a GoAway once idle", err)
			}
			if resp.GetPong() != nil {
				if time.Now().After(giveUp) {
					t.Fatalf("got = pongs for 20s, expected: a GoAway once idle for %v", limits.PipelineIdleTimeout)
				}
				continue
			}
			if ga := resp.GetGoAway(); ga == nil || ga.GetLastId() != 1 {
				t.Fatalf("got = %v, expected: GoAway with last_id 1", resp)
			}
			break
		}
		if _, err := p.readErr(); !errors.Is(err, io.EOF) {
			t.Errorf("after the GoAway: got = %v, expected: the connection closed", err)
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Errorf("the pinger could still write 10s after the GoAway")
		}
	})

	t.Run("a wait in flight keeps it open", func(t *testing.T) {
		holder := openSession(t, ts, "holder", 30*time.Second)
		waiter := openSession(t, ts, "waiter", 30*time.Second)
		first := acquire(t, ts, holder.Id, "idle-job", false)
		p := openPipe(t, ts)
		p.write(&tenurev1.PipelineRequest{Id: 7, Op: &tenurev1.PipelineRequest_Acquire{Acquire: &tenurev1.AcquireRequest{SessionId: waiter.Id, Name: "idle-job", Wait: true}}})
		waitForWaiters(t, ts, "idle-job", 1)
		time.Sleep(4 * limits.PipelineIdleTimeout)
		p.pingPong(8)
		release(t, ts, "idle-job", first.Token)
		if resp := p.read(); resp.GetId() != 7 || resp.GetAcquire() == nil {
			t.Fatalf("got = %v, expected: the grant for request 7", resp)
		}
		if resp := p.read(); resp.GetGoAway().GetLastId() != 8 {
			t.Fatalf("got = %v, expected: GoAway with last_id 8 once idle", resp)
		}
	})
}

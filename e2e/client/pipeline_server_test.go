package client_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/internal/testnet"
)

// sniffer forwards TCP connections to a target and keeps what each
// client sent (up to 4 MiB a connection), so that a test can tell
// which HTTP/1.1 requests went out, and on how many connections.
type sniffer struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []*sniffed
	open  []net.Conn
}

type sniffed struct {
	mu   sync.Mutex
	sent []byte
}

func startSniffer(t testing.TB, target string) *sniffer {
	t.Helper()
	s := &sniffer{ln: testnet.Listen(t), target: target}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() {
		s.ln.Close()
		s.mu.Lock()
		for _, c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *sniffer) Addr() string { return s.ln.Addr().String() }

func (s *sniffer) accept() {
	defer s.wg.Done()
	for {
		in, err := s.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", s.target)
		if err != nil {
			in.Close()
			continue
		}
		rec := &sniffed{}
		s.mu.Lock()
		s.conns = append(s.conns, rec)
		s.open = append(s.open, in, out)
		s.mu.Unlock()
		s.wg.Add(2)
		go func() {
			defer s.wg.Done()
			defer out.Close()
			defer in.Close()
			_, _ = io.Copy(in, out)
		}()
		go func() {
			defer s.wg.Done()
			defer out.Close()
			defer in.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					rec.mu.Lock()
					if len(rec.sent) < 4<<20 {
						rec.sent = append(rec.sent, buf[:n]...)
					}
					rec.mu.Unlock()
					if _, werr := out.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// requestLine matches an HTTP/1.1 request line, and HTTP/2's preface. A
// request on a reused connection follows the last one's body, which
// need not end a line.
var requestLine = regexp.MustCompile(`(GET|POST|PRI) (\S+) HTTP/[12]\.[01]\r\n`)

// Requests lists, for each connection, the request lines the client
// sent on it ("POST /v1/pipeline"; "PRI *" opens an HTTP/2 connection).
func (s *sniffer) Requests() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]string, 0, len(s.conns))
	for _, c := range s.conns {
		c.mu.Lock()
		var lines []string
		for _, m := range requestLine.FindAllSubmatch(c.sent, -1) {
			lines = append(lines, string(m[1])+" "+string(m[2]))
		}
		c.mu.Unlock()
		out = append(out, lines)
	}
	return out
}

// requestsTotal reads the server's tenure_requests_total for method
// with code ok.
func requestsTotal(t *testing.T, addr, method string) int {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	want := fmt.Sprintf(`tenure_requests_total{code="ok",method=%q} `, method)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), want); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	return 0
}

// Against a real server, locks and key operations go over one pipelined
// connection: the server counts them under their methods, no unary
// request for them crosses the wire, and the client opens a handful of
// connections for it all.
func TestPipelineCarriesLocksAndKeysOnRealServer(t *testing.T) {
	addr := startServer(t)
	sn := startSniffer(t, addr)
	c := newClient(t, sn.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newSession(t, c)
	const rounds = 100
	m := s.Mutex("pipelined")
	for i := range rounds {
		if err := m.Lock(ctx); err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("unlock %d: %v", i, err)
		}
	}
	kv := c.KV()
	for i := range rounds / 2 {
		key := fmt.Sprintf("k%d", i)
		if _, err := kv.Put(ctx, key, "a"); err != nil {
			t.Fatal(err)
		}
		if got, err := kv.Get(ctx, key); err != nil || got.Value != "a" {
			t.Fatalf("got = %+v, %v, expected: value a", got, err)
		}
		if _, err := kv.CompareAndSwap(ctx, key, client.ValueIs("a"), "b"); err != nil {
			t.Fatal(err)
		}
		var cf *client.CompareFailedError
		if _, err := kv.CompareAndSwap(ctx, key, client.ValueIs("a"), "c"); !errors.As(err, &cf) || cf.Current.Value != "b" {
			t.Fatalf("got = %v, expected: a failed compare showing value b", err)
		}
	}
	s.Close(ctx)
	c.Close()

	for method, atLeast := range map[string]int{
		"/tenure.v1.LeaseService/Acquire":     rounds,
		"/tenure.v1.LeaseService/Release":     rounds,
		"/tenure.v1.KVService/Put":            rounds / 2,
		"/tenure.v1.KVService/Get":            rounds / 2,
		"/tenure.v1.KVService/CompareAndSwap": rounds / 2,
	} {
		if n := requestsTotal(t, addr, method); n < atLeast {
			t.Errorf("got = %d %s answered ok, expected: at least %d", n, method, atLeast)
		}
	}
	conns := sn.Requests()
	pipelines := 0
	for i, lines := range conns {
		for j, line := range lines {
			switch {
			case line == "POST /v1/pipeline":
				// The pool may hand over a connection that carried unary
				// calls; nothing follows the upgrade as HTTP.
				if j != len(lines)-1 {
					t.Errorf("connection %d: HTTP requests %v after the upgrade", i, lines[j+1:])
				}
				pipelines++
			case strings.HasSuffix(line, ".LeaseService/Acquire"), strings.HasSuffix(line, ".LeaseService/Release"),
				strings.HasSuffix(line, ".LeaseService/Watch"), strings.Contains(line, ".KVService/"):
				t.Errorf("connection %d: unary %s, expected: on the pipeline", i, line)
			}
		}
	}
	if pipelines != 1 {
		t.Errorf("got = %d pipeline upgrades, expected: 1", pipelines)
	}
	// The pipeline (which may first have opened the session), an
	// HTTP/1.1 connection for the other unary calls, the HTTP/2 one for
	// the heartbeats.
	if len(conns) > 4 {
		t.Errorf("got = %d connections %v, expected: at most 4", len(conns), conns)
	}
}

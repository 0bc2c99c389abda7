package nativeapi

import (
	"sync"
	"time"
)

// pipeConns tracks upgraded connections, which http.Server.Shutdown
// does not see once hijacked.
type pipeConns struct {
	mu     sync.Mutex
	conns  map[*pipeConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func (p *pipeConns) add(pc *pipeConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.conns == nil {
		p.conns = map[*pipeConn]struct{}{}
	}
	pc.stopping = make(chan struct{})
	p.conns[pc] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *pipeConns) remove(pc *pipeConn) {
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
	p.wg.Done()
}

// closeAll stops every pipeline and waits for each to answer what it
// read and say GoAway. A pipeline that writes nothing for timeout (its
// client stopped reading) is cut, as is any still open after
// closeAllLimit timeouts: thousands of parked watches each answered
// under load take longer than one timeout, and cutting them midway
// leaves their client with EOF instead of answers.
func (p *pipeConns) closeAll(timeout time.Duration) {
	p.mu.Lock()
	p.closed = true
	conns := make([]*pipeConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		pc.touch()
		pc.stop()
	}
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	tick := time.NewTicker(timeout / 4)
	defer tick.Stop()
	limit := time.NewTimer(closeAllLimit * timeout)
	defer limit.Stop()
	for {
		select {
		case <-done:
			return
		case <-limit.C:
			for _, pc := range conns {
				pc.conn.Close()
			}
			<-done
			return
		case <-tick.C:
			for _, pc := range conns {
				if time.Since(time.Unix(0, pc.lastActive.Load())) > timeout {
					pc.conn.Close()
				}
			}
		}
	}
}

// closeAllLimit bounds closeAll, in timeouts, against a client that
// reads just fast enough never to look stalled.
const closeAllLimit = 10

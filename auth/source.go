package auth

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Source is the policy in force, read from a file, and read again when
// the file changes (checked every second by Watch) or when Reload is
// called (on SIGHUP). A file that does not parse or validate is refused
// and the policy before it stays.
type Source struct {
	path     string
	onReload func(p *Policy, err error)

	// cur is file with etcd's store (Policy.WithEtcd), what callers
	// meet; file is the file's alone (nil without one).
	cur   atomic.Pointer[Policy]
	mu    sync.Mutex // one reload or store change at a time; guards the below
	stamp string
	file  *Policy
	etcd  EtcdStore
}

// Load reads the policy at path. onReload, if not nil, is told of every
// later reload's outcome (the server audits it).
func Load(path string, onReload func(p *Policy, err error)) (*Source, error) {
	s := &Source{path: path, onReload: onReload}
	p, stamp, err := s.read()
	if err != nil {
		return nil, err
	}
	s.file, s.stamp = p, stamp
	s.cur.Store(p)
	return s, nil
}

// Static is a Source whose file never changes, for tests and
// embedding; p nil is a node without a policy file.
func Static(p *Policy) *Source {
	s := &Source{file: p}
	s.cur.Store(p.WithEtcd(EtcdStore{}))
	return s
}

// SetEtcd puts etcd's users and roles, as the replicated state now
// holds them, in force beside the file (Policy.WithEtcd).
func (s *Source) SetEtcd(st EtcdStore) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.etcd = st
	s.cur.Store(s.file.WithEtcd(st))
}

// Policy is the policy in force.
func (s *Source) Policy() *Policy { return s.cur.Load() }

// Path is the file the policy comes from ("" for a static one).
func (s *Source) Path() string { return s.path }

func (s *Source) read() (*Policy, string, error) {
	fi, err := os.Stat(s.path)
	if err != nil {
		return nil, "", fmt.Errorf("policy file: %w", err)
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return nil, "", fmt.Errorf("policy file: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, "", fmt.Errorf("policy file %s: %w", s.path, err)
	}
	return p, fmt.Sprintf("%d:%d", fi.Size(), fi.ModTime().UnixNano()), nil
}

// Reload reads the file again. On error the policy in force stays.
func (s *Source) Reload() error {
	if s.path == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloadLocked()
}

func (s *Source) reloadLocked() error {
	p, stamp, err := s.read()
	if err == nil {
		s.file = p
		s.cur.Store(p.WithEtcd(s.etcd))
	}
	// A bad file is not retried until it changes again.
	if stamp == "" {
		if fi, serr := os.Stat(s.path); serr == nil {
			stamp = fmt.Sprintf("%d:%d", fi.Size(), fi.ModTime().UnixNano())
		}
	}
	s.stamp = stamp
	if s.onReload != nil {
		s.onReload(p, err)
	}
	return err
}

// Watch reloads the policy whenever its file changes, until ctx ends.
func (s *Source) Watch(ctx context.Context, every time.Duration) {
	if s.path == "" {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(s.path)
		if err != nil {
			continue // being replaced; the next tick sees the new one
		}
		stamp := fmt.Sprintf("%d:%d", fi.Size(), fi.ModTime().UnixNano())
		s.mu.Lock()
		if stamp != s.stamp {
			_ = s.reloadLocked()
		}
		s.mu.Unlock()
	}
}

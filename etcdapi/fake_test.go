package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"

	"github.com/tenurehq/tenure/frontend"
	"github.com/tenurehq/tenure/statemachine"
	"github.com/tenurehq/tenure/watch"
)

// fakeBackend is one node that is always the leader: commands apply at
// once to a machine at the latest cluster version, and sessions expire
// when a test calls expire. It is what the services need, without raft.
type fakeBackend struct {
	mu       sync.Mutex
	m        *statemachine.Machine
	hub      *watch.Hub
	deadline map[int64]time.Time // session → when it expires
	ttl      map[int64]time.Duration
	done     chan struct{}
	// deny, when set, refuses every Authorize.
	deny bool
	// watches counts the open watches; maxWatches (0: none) bounds them.
	watches, maxWatches int
	// waits counts the parked waits; maxWaits (0: none) bounds them.
	waits, maxWaits int
	// audited is what Audit was told, one line each.
	audited []string
}

func newFakeBackend(t testing.TB) *fakeBackend {
	f := &fakeBackend{
		m:        statemachine.New(),
		hub:      watch.NewHub(0),
		deadline: map[int64]time.Time{},
		ttl:      map[int64]time.Duration{},
		done:     make(chan struct{}),
	}
	f.apply(statemachine.SetVersion{Version: statemachine.Version})
	t.Cleanup(func() { close(f.done) })
	return f
}

func (f *fakeBackend) apply(cmd statemachine.Command) statemachine.Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := f.m.Apply(time.Now().UnixNano(), cmd)
	f.hub.Publish(res.Events)
	for _, e := range res.Events {
		switch e.Type {
		case statemachine.EventSessionOpened:
			ttl := time.Duration(e.Session.TTL)
			f.ttl[e.SessionID], f.deadline[e.SessionID] = ttl, time.Now().Add(ttl)
		case statemachine.EventSessionClosed, statemachine.EventSessionExpired:
			delete(f.ttl, e.SessionID)
			delete(f.deadline, e.SessionID)
		}
	}
	return res
}

// expire ends session id as the leader's lessor would at its deadline.
func (f *fakeBackend) expire(id int64) {
	f.apply(statemachine.ExpireSessions{Epoch: f.m.Epoch(), IDs: []int64{id}})
}

func (f *fakeBackend) Propose(ctx context.Context, cmd statemachine.Command) (statemachine.Result, error) {
	if err := ctx.Err(); err != nil {
		return statemachine.Result{}, err
	}
	res := f.apply(cmd)
	return res, res.Err
}

func (f *fakeBackend) Read(ctx context.Context, serializable bool, fn func(m *statemachine.Machine) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fn(f.m)
}

// Sync has nothing to do: the fake is its own leader.
func (f *fakeBackend) Sync(context.Context) {}

func (f *fakeBackend) Renew(ctx context.Context, id int64) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ttl, ok := f.ttl[id]
	if !ok {
		return 0, fmt.Errorf("%w: %d", statemachine.ErrSessionNotFound, id)
	}
	f.deadline[id] = time.Now().Add(ttl)
	return ttl, nil
}

func (f *fakeBackend) Remaining(ctx context.Context, id int64) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.deadline[id]
	if !ok {
		return 0, fmt.Errorf("%w: %d", statemachine.ErrSessionNotFound, id)
	}
	return time.Until(d), nil
}

func (f *fakeBackend) Watch(start int64, filter func(*statemachine.Event) bool) (*watch.Watcher, error) {
	return f.hub.Watch(start, filter)
}

func (f *fakeBackend) Authorize(ctx context.Context, verb Verb, key, end string) error {
	if f.deny {
		return rpctypes.ErrGRPCPermissionDenied
	}
	return nil
}

func (f *fakeBackend) Identity(ctx context.Context) string { return "etcd" }

func (f *fakeBackend) SessionTTL() (time.Duration, time.Duration) {
	return time.Second, 24 * time.Hour
}

func (f *fakeBackend) Node(ctx context.Context) (NodeInfo, error) {
	return NodeInfo{
		ClusterID: 1, MemberID: 2, Name: "fake", LeaderID: 2, RaftTerm: 1, Version: "test",
		Members: []Member{{ID: 2, Name: "fake", PeerURLs: []string{"http://127.0.0.1:1"}, ClientURLs: []string{"http://127.0.0.1:2"}}},
	}, nil
}

func (f *fakeBackend) Ident() (uint64, uint64, uint64) { return 1, 2, 1 }

// Alarms lists the machine's alarms; the fake is member 2, "fake".
func (f *fakeBackend) Alarms(ctx context.Context) ([]*pb.AlarmMember, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*pb.AlarmMember
	for _, a := range f.m.Alarms() {
		if a.Member == "fake" {
			out = append(out, &pb.AlarmMember{MemberID: 2, Alarm: pb.AlarmType(a.Alarm)})
		}
	}
	return out, nil
}

func (f *fakeBackend) Disarm(ctx context.Context, member uint64, alarm pb.AlarmType) error {
	alarms, _ := f.Alarms(ctx)
	for _, a := range alarms {
		if a.MemberID == member && a.Alarm == alarm {
			return f.apply(statemachine.SetAlarm{Member: "fake", Alarm: statemachine.AlarmType(alarm)}).Err
		}
	}
	return errors.New("no such alarm")
}

func (f *fakeBackend) Authenticate(ctx context.Context, name, password string) (string, error) {
	return "", rpctypes.ErrGRPCAuthNotEnabled
}

func (f *fakeBackend) AuthEnabled() bool           { return false }
func (f *fakeBackend) PolicyFileNames(string) bool { return false }
func (f *fakeBackend) BcryptCost() int             { return bcrypt.MinCost }

func (f *fakeBackend) Done() <-chan struct{} { return f.done }

func (f *fakeBackend) HoldWatch(ctx context.Context) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.maxWatches > 0 && f.watches >= f.maxWatches {
		return nil, fmt.Errorf("%w: %d open watches", frontend.ErrLimit, f.watches)
	}
	f.watches++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.watches--
	}, nil
}

// serve runs the etcd services over b on 127.0.0.1 and returns an etcd
// client of it.
func serve(t testing.TB, b Backend) *clientv3.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(ServerOptions(DefaultMaxRequestBytes)...)
	Register(gs, b)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{ln.Addr().String()},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (f *fakeBackend) HoldWait(ctx context.Context) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.maxWaits > 0 && f.waits >= f.maxWaits {
		return nil, fmt.Errorf("%w: %d parked waits", frontend.ErrLimit, f.waits)
	}
	f.waits++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.waits--
		})
	}, nil
}

func (f *fakeBackend) MaySee(context.Context, statemachine.Session) bool { return true }

func (f *fakeBackend) Audit(_ context.Context, action, target string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.audited = append(f.audited, fmt.Sprintf("%s %s: %v", action, target, err))
}

func (f *fakeBackend) MaxResponseBytes() int { return 0 }

// Arm raises an alarm of member 2, the fake; no other member exists.
func (f *fakeBackend) Arm(ctx context.Context, member uint64, alarm pb.AlarmType) error {
	if member != 2 {
		return fmt.Errorf("%w: %x", ErrMemberNotFound, member)
	}
	return f.apply(statemachine.SetAlarm{Member: "fake", Alarm: statemachine.AlarmType(alarm), Active: true}).Err
}

// MoveLeader succeeds for the fake itself, the only voter.
func (f *fakeBackend) MoveLeader(ctx context.Context, target uint64) error {
	if target != 2 {
		return fmt.Errorf("%w: %x", ErrBadLeaderTransferee, target)
	}
	return nil
}

func (f *fakeBackend) Members() Membership { return fakeMembership{} }

// fakeMembership refuses every change: the fake is a cluster of one.
type fakeMembership struct{}

var _ Membership = fakeMembership{}

func (fakeMembership) Add(context.Context, []string, bool) (Member, error) {
	return Member{}, ErrBadMemberURLs
}
func (fakeMembership) Remove(context.Context, uint64) error           { return ErrMemberNotFound }
func (fakeMembership) Update(context.Context, uint64, []string) error { return ErrMemberNotFound }
func (fakeMembership) Promote(context.Context, uint64) error          { return ErrMemberNotFound }

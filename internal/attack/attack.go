// Package attack races a principal's calls against another principal's
// sessions and grants, the way the outside attack of issue 21 did: it
// aims Close, Acquire, Release, SetValue, Put and CompareAndSwap at IDs
// and tokens that do not exist yet (the next revisions, which anybody
// can read) while the victim opens sessions and takes grants, then
// reports what of the victim's the attacker managed to touch. The server
// package runs it against one node, e2e against a follower of a 3-node
// TLS cluster of real processes; both expect an empty report.
package attack

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/api/tenure/v1/tenurev1connect"
)

// Party is one principal's view of a node.
type Party struct {
	Sessions tenurev1connect.SessionServiceClient
	Leases   tenurev1connect.LeaseServiceClient
	KV       tenurev1connect.KVServiceClient
}

// NewParty calls baseURL through hc, which carries the principal's
// credentials.
func NewParty(hc connect.HTTPClient, baseURL string) Party {
	return Party{
		Sessions: tenurev1connect.NewSessionServiceClient(hc, baseURL),
		Leases:   tenurev1connect.NewLeaseServiceClient(hc, baseURL),
		KV:       tenurev1connect.NewKVServiceClient(hc, baseURL),
	}
}

// Race is one attack.
type Race struct {
	// Victim opens sessions, acquires leases in SharedNamespace (where
	// both may lock) and leaves them alone.
	Victim Party
	// Attacker aims at the victim's next IDs from Goroutines goroutines.
	Attacker Party
	// Observer reads the outcome: it must read every namespace and key.
	Observer Party
	// SharedNamespace is a namespace both may lock in; AttackerNamespace
	// one only the attacker may; AttackerKeys a key prefix only the
	// attacker may write.
	SharedNamespace, AttackerNamespace, AttackerKeys string
	// Sessions is how many sessions the victim opens, one at a time.
	Sessions   int
	Goroutines int
	// Ahead is how many IDs past the current revision each salvo aims at.
	Ahead int
}

// Report is what the attacker did to the victim: every list empty means
// the attack failed.
type Report struct {
	ClosedSessions []int64  // victim sessions closed by the attacker
	ForeignGrants  []string // grants taken in the attacker's namespace under a victim session
	ReleasedGrants []string // victim grants released by the attacker
	ChangedValues  []string // victim grants whose value the attacker set
	BoundKeys      []string // attacker keys bound to a victim session
	// Salvos is how many attacking calls were sent; Refused how many
	// were refused as permission denied (at the edge or at apply), and
	// RefusedAtApply how many of those the state machine refused (its
	// "not owner"): the calls that won the race past the edge.
	Salvos, Refused, RefusedAtApply int64
}

// Empty reports whether the attacker touched nothing of the victim's.
func (r Report) Empty() bool {
	return len(r.ClosedSessions)+len(r.ForeignGrants)+len(r.ReleasedGrants)+len(r.ChangedValues)+len(r.BoundKeys) == 0
}

func (r Report) String() string {
	return fmt.Sprintf("closed sessions %v, grants under victim sessions %v, released %v, values set %v, keys bound %v (%d calls, %d refused, %d of them at apply)",
		r.ClosedSessions, r.ForeignGrants, r.ReleasedGrants, r.ChangedValues, r.BoundKeys, r.Salvos, r.Refused, r.RefusedAtApply)
}

const poisoned = "attacker was here"

// Run races the attacker against the victim until the victim has opened
// its sessions, then reads what happened. It returns an error only when
// the victim itself cannot work.
func (r Race) Run(ctx context.Context) (Report, error) {
	var rep Report
	var salvos, refused, atApply atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range r.Goroutines {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				rev := r.revision(ctx)
				for id := rev + 1; id <= rev+int64(r.Ahead); id++ {
					for _, call := range r.salvo(id, fmt.Sprintf("%d-%d", g, i)) {
						salvos.Add(1)
						if err := call(ctx); connect.CodeOf(err) == connect.CodePermissionDenied {
							refused.Add(1)
							if strings.Contains(err.Error(), "not owner") {
								atApply.Add(1)
							}
						}
					}
				}
			}
		})
	}

	type grant struct {
		name           string
		session, token int64
	}
	var sessions []int64
	var grants []grant
	var victimErr error
	for i := range r.Sessions {
		open, err := r.Victim.Sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
		if err != nil {
			victimErr = fmt.Errorf("victim opens session %d: %w", i, err)
			break
		}
		id := open.Msg.GetSession().GetId()
		sessions = append(sessions, id)
		name := fmt.Sprintf("victim-%d", id)
		acq, err := r.Victim.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: id, Namespace: r.SharedNamespace, Name: name, Value: "mine"}))
		switch {
		case err == nil:
			grants = append(grants, grant{name, id, acq.Msg.GetToken()})
		case connect.CodeOf(err) == connect.CodeNotFound:
			// The attacker closed the session first: the report says so.
		default:
			victimErr = fmt.Errorf("victim acquires %s: %w", name, err)
		}
		if victimErr != nil {
			break
		}
	}
	close(stop)
	wg.Wait()
	rep.Salvos, rep.Refused, rep.RefusedAtApply = salvos.Load(), refused.Load(), atApply.Load()
	if victimErr != nil {
		return rep, victimErr
	}

	for _, id := range sessions {
		if _, err := r.Observer.Sessions.Get(ctx, connect.NewRequest(&tenurev1.GetSessionRequest{SessionId: id})); connect.CodeOf(err) == connect.CodeNotFound {
			rep.ClosedSessions = append(rep.ClosedSessions, id)
		} else if err != nil {
			return rep, fmt.Errorf("read session %d: %w", id, err)
		}
	}
	for _, g := range grants {
		l, err := r.Observer.Leases.Get(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{Namespace: r.SharedNamespace, Name: g.name}))
		if err != nil {
			return rep, fmt.Errorf("read lease %s: %w", g.name, err)
		}
		i := slices.IndexFunc(l.Msg.GetLease().GetHolders(), func(h *tenurev1.Grant) bool { return h.GetToken() == g.token })
		switch {
		case i < 0 && !slices.Contains(rep.ClosedSessions, g.session):
			rep.ReleasedGrants = append(rep.ReleasedGrants, fmt.Sprintf("%s@%d", g.name, g.token))
		case i >= 0 && l.Msg.GetLease().GetHolders()[i].GetValue() != "mine":
			rep.ChangedValues = append(rep.ChangedValues, fmt.Sprintf("%s@%d", g.name, g.token))
		}
	}
	ls, err := r.Observer.Leases.List(ctx, connect.NewRequest(&tenurev1.ListLeasesRequest{Namespace: r.AttackerNamespace}))
	if err != nil {
		return rep, fmt.Errorf("list %s: %w", r.AttackerNamespace, err)
	}
	for _, l := range ls.Msg.GetLeases() {
		for _, h := range l.GetHolders() {
			if slices.Contains(sessions, h.GetSessionId()) {
				rep.ForeignGrants = append(rep.ForeignGrants, fmt.Sprintf("%s@%d by session %d", l.GetName(), h.GetToken(), h.GetSessionId()))
			}
		}
	}
	kvs, err := r.Observer.KV.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: r.AttackerKeys}))
	if err != nil {
		return rep, fmt.Errorf("range %s: %w", r.AttackerKeys, err)
	}
	for _, kv := range kvs.Msg.GetKvs() {
		if slices.Contains(sessions, kv.GetSessionId()) {
			rep.BoundKeys = append(rep.BoundKeys, fmt.Sprintf("%s to session %d", kv.GetKey(), kv.GetSessionId()))
		}
	}
	return rep, nil
}

// revision is the store's global revision as the attacker reads it: the
// next session IDs and tokens are the revisions after it.
func (r Race) revision(ctx context.Context) int64 {
	res, err := r.Attacker.KV.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Prefix: r.AttackerKeys, Limit: 1}))
	if err != nil {
		return 0
	}
	return res.Msg.GetGlobalRevision()
}

// salvo is every call the attacker aims at id, as a session ID and as a
// token.
func (r Race) salvo(id int64, tag string) []func(context.Context) error {
	a := r.Attacker
	key := r.AttackerKeys + tag
	return []func(context.Context) error{
		func(ctx context.Context) error {
			_, err := a.Sessions.Close(ctx, connect.NewRequest(&tenurev1.CloseSessionRequest{SessionId: id}))
			return err
		},
		func(ctx context.Context) error {
			_, err := a.Leases.Acquire(ctx, connect.NewRequest(&tenurev1.AcquireRequest{SessionId: id, Namespace: r.AttackerNamespace, Name: "stolen-" + tag}))
			return err
		},
		func(ctx context.Context) error {
			_, err := a.Leases.Release(ctx, connect.NewRequest(&tenurev1.ReleaseRequest{Namespace: r.SharedNamespace, Name: fmt.Sprintf("victim-%d", id-1), Token: id}))
			return err
		},
		func(ctx context.Context) error {
			_, err := a.Leases.SetValue(ctx, connect.NewRequest(&tenurev1.SetValueRequest{Namespace: r.SharedNamespace, Name: fmt.Sprintf("victim-%d", id-1), Token: id, Value: poisoned}))
			return err
		},
		func(ctx context.Context) error {
			_, err := a.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: key, Value: poisoned, SessionId: id}))
			return err
		},
		func(ctx context.Context) error {
			_, err := a.KV.CompareAndSwap(ctx, connect.NewRequest(&tenurev1.CompareAndSwapRequest{
				Key: key + "-cas", Value: poisoned, SessionId: id, Compare: &tenurev1.Compare{Target: &tenurev1.Compare_Absent{Absent: true}},
			}))
			return err
		},
	}
}

// Heartbeats keeps a KeepAlive stream beating for the IDs ahead of the
// store's revision until ctx ends, reopening the stream whenever the
// server ends it, as a patient attacker would. It returns how many
// streams the server ended with permission denied.
func Heartbeats(ctx context.Context, attacker Party, ids func() []int64, every time.Duration) (denied int64) {
	for ctx.Err() == nil {
		streamCtx, cancel := context.WithCancel(ctx)
		stream := attacker.Sessions.KeepAlive(streamCtx)
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := stream.Receive(); err != nil {
					ended <- err
					return
				}
			}
		}()
		var err error
		t := time.NewTicker(every)
	beating:
		for {
			for _, id := range ids() {
				if stream.Send(&tenurev1.KeepAliveRequest{SessionId: id}) != nil {
					break // the server ended the stream: its reason comes from Receive
				}
			}
			select {
			case err = <-ended:
				break beating
			case <-ctx.Done():
				break beating
			case <-t.C:
			}
		}
		t.Stop()
		_ = stream.CloseRequest()
		cancel()
		if err == nil {
			err = <-ended
		}
		_ = stream.CloseResponse()
		if connect.CodeOf(err) == connect.CodePermissionDenied {
			denied++
		}
		select {
		case <-ctx.Done():
		case <-time.After(every):
		}
	}
	return denied
}

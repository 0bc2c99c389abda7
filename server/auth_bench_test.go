package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/auth"
)

// BenchmarkAuthorize is what a policy adds to each call on the server:
// the check of an Acquire (a namespace rule and the session's owner,
// read from state) and of a key Get, by a token principal, in parallel.
// docs/security.md quotes it.
func BenchmarkAuthorize(b *testing.B) {
	as := startAuthServer(b)
	ctx := context.Background()
	a := as.clients(b, "token:team-a")
	open, err := a.sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{Ttl: durationpb.New(time.Minute)}))
	if err != nil {
		b.Fatal(err)
	}
	caller := withCaller(ctx, auth.Caller{Principal: "team-a", By: auth.ByToken})
	for _, bc := range []struct {
		name string
		msg  any
	}{
		{"acquire", &tenurev1.AcquireRequest{SessionId: open.Msg.Session.Id, Namespace: "team-a", Name: "job"}},
		{"get", &tenurev1.GetRequest{Key: "team-a/config"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := as.check(caller, bc.msg); err != nil {
						panic(fmt.Sprint(err))
					}
				}
			})
		})
	}
}

package fence_test

import (
	"context"
	"testing"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
)

func TestContextSourceFollowsTheGrantContext(t *testing.T) {
	addr := startServer(t)
	c := newClient(t, addr)
	s := newSession(t, c, "a")
	m := s.Mutex("ctx-source")
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	src := fence.ContextSource(m.Context())
	got, ok := src.Token()
	held, _ := m.Token()
	want := client.Token{Namespace: "default", Name: "ctx-source", Token: held.Token}
	if !ok || got != want {
		t.Fatalf("got = %v %v, expected: %v, valid", got, ok, want)
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := src.Token(); ok {
		t.Fatalf("got = valid after Unlock, expected: not valid once the grant's context ended")
	}
	if _, ok := fence.ContextSource(context.Background()).Token(); ok {
		t.Fatalf("got = valid for a context without a grant, expected: not valid")
	}
}

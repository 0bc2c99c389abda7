package server

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// A key watch runs on the keys' clock: it starts at a KV revision, its
// events carry their keys' mod revisions, the events of one command
// share theirs, and a watcher the node's event hub dropped (here: one
// with a history of 4 events that misses 60) resumes from the keys'
// history exactly where it stopped, with nothing missed or repeated.
func TestKeyWatchFollowsTheKeysClockThroughALag(t *testing.T) {
	limits := testLimits()
	limits.WatchHistory = 4
	ts := startServer(t, t.TempDir(), limits)
	ctx := ctxT(t)
	first, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: "w/0", Value: "v"}))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := ts.KV.Watch(ctx, connect.NewRequest(&tenurev1.WatchRequest{Key: "w/", Prefix: true, StartRevision: first.Msg.GetRevision()}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	type ev struct {
		typ tenurev1.WatchEventType
		key string
		rev int64
	}
	want := []ev{{tenurev1.WatchEventType_WATCH_EVENT_TYPE_PUT, "w/0", first.Msg.GetRevision()}}
	for i := 1; i <= 30; i++ {
		key := fmt.Sprintf("w/%d", i)
		put, err := ts.KV.Put(ctx, connect.NewRequest(&tenurev1.PutRequest{Key: key, Value: "v"}))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, ev{tenurev1.WatchEventType_WATCH_EVENT_TYPE_PUT, key, put.Msg.GetRevision()})
		// A session touched between puts moves the global revision,
		// not the keys'.
		if _, err := ts.Sessions.Open(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{})); err != nil {
			t.Fatal(err)
		}
	}
	del, err := ts.KV.Delete(ctx, connect.NewRequest(&tenurev1.DeleteRequest{Key: "w/1", Prefix: true}))
	if err != nil {
		t.Fatal(err)
	}
	// w/1 and w/10..w/19, in key order, all at the delete's revision.
	for _, key := range []string{"w/1", "w/10", "w/11", "w/12", "w/13", "w/14", "w/15", "w/16", "w/17", "w/18", "w/19"} {
		want = append(want, ev{tenurev1.WatchEventType_WATCH_EVENT_TYPE_DELETE, key, del.Msg.GetRevision()})
	}
	for i, w := range want {
		if !stream.Receive() {
			t.Fatalf("event %d: stream ended: %v", i, stream.Err())
		}
		m := stream.Msg()
		if got := (ev{m.GetType(), m.GetKv().GetKey(), m.GetRevision()}); got != w {
			t.Fatalf("event %d: got = %v, expected: %v", i, got, w)
		}
		if m.GetType() == tenurev1.WatchEventType_WATCH_EVENT_TYPE_PUT && m.GetKv().GetModRevision() != m.GetRevision() {
			t.Fatalf("event %d: revision %d, mod revision %d, expected: the same", i, m.GetRevision(), m.GetKv().GetModRevision())
		}
	}
}

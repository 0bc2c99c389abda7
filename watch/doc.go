// Package watch fans applied state machine events out to watchers: the key
// and lease watches of the API.
//
// A Hub keeps the last N events in one ring shared by every watcher, and
// each Watcher is only a cursor into it (the next revision to read) plus a
// filter. Revisions are contiguous, so the ring maps a revision straight to
// its slot, and a watcher that wants to start in the past just sets its
// cursor there.
//
// Why one ring with cursors instead of a channel per watcher: with channels,
// Publish does work per watcher and must choose, for a full channel, between
// blocking the apply path and dropping events. With the ring, Publish is
// O(len(events)) whatever the number of watchers and never waits for one;
// memory is the ring, not N copies of a backlog; and falling behind is
// detected exactly, at read time, as "my cursor is older than the oldest
// event kept". That watcher gets ErrLagged naming the revision to resync
// from (DESIGN.md, safety rule 8: watches never silently drop); the others
// are not affected.
//
// Waiting costs a watcher nothing per publish only if the hub can tell,
// without asking it, that an event is not for it. A watcher on the hub's
// broadcast is woken by every publish, to scan the new events itself; one
// with a wake predicate (Want) is asked about each, on the publishing
// goroutine. Either is O(waiting watchers) a publish. A watcher of one
// key or lease (WantKey), the common case, waits in an index by that key,
// and a publish looks up its events' keys only: the cost is the watchers
// woken, and a waiting keyed watcher is moved past the events it did not
// want lazily, when it is next looked at (keyed.go argues why that is
// exact). Prefix and range watchers still pay O(watchers) a publish.
//
// The history is bounded twice: by a count of events (the ring) and by
// the bytes of their keys, values and names (NewHubBytes), because a
// count alone does not bound memory when each event may carry two values
// of 64 KiB. Whichever bound is reached first drops the oldest events.
// Bytes reports what the history holds, for the server's storage quota.
//
// Caller's duties:
//   - Call Reset with the restored revision at startup and after every
//     snapshot restore, before publishing the events that follow it.
//   - Call Publish with the events of every applied command, in apply
//     order, from the one goroutine that applies the log.
//   - Treat published events as read-only: the hub and every watcher share
//     them, including the KeyValue and Session they point to.
//   - Close every Watcher when its stream ends.
package watch

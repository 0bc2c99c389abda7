// Package keyfeed is the key watch, written once for every API: the
// keys' events from a KV revision on, first from the state machine's
// history, then live from the node's event hub, joined exactly.
//
// The join. The past is read under one state read (Source.Read) with
// Machine.KeyEvents, together with the global revision G the state was
// at; the present is the hub (watch.Hub), followed from G+1. Every event
// up to G is in the read, every one after it in the hub, so nothing is
// missed or sent twice. A history read looks at a bounded number of
// events, so that a watch from long ago does not hold up the node's
// applies; the next read goes on where it stopped, and only the last
// one, which reaches the state's end, pins G.
//
// The keys' clock. A watch's start and its events' revisions are KV
// revisions (statemachine/mvcc.go), and a key event's KV revision is its
// key's mod revision, on either clock: before cluster version 5 keys
// take the global revision, and the KV revision starts above it when the
// version is raised. So a feed reads every event's revision from its
// key, never from the hub, and a node whose state is from before
// version 5 — the cluster's, or only this node's, restarted or catching
// up and not yet past the entry that raised it — serves a watch from the
// hub's history by the same rule, and goes on serving it right once that
// entry applies.
//
// Whole revisions. The events of one command share a KV revision (a Txn
// is one), and a feed hands them over together, in one Batch: the hub
// publishes one command's events in one call, so once a feed has seen
// the first of them, polling the hub without waiting (watch.Watcher.Poll)
// until it has looked at everything published gathers the rest. This is
// what etcd's protocol needs (a Txn's events in one response) and it
// makes the lag resync simple: a feed the hub drops (watch.ErrLagged) has
// handed over whole revisions only, so it reads the history again from
// the first one it has not, and follows the hub from there. A feed
// whose history is compacted by then, or from the start, fails with a
// *watch.CompactedError naming the compact revision.
//
// Level. An API that answers "you have everything up to revision R" (etcd's
// progress) must know that a feed has handed over every event it owes up
// to the global revision R was read at. Each Batch says how far that is
// (Level), and Mark asks a feed that has nothing to hand over to say it
// once it is that far.
//
// Why one feed a watch, and not one hub watcher for all the watches of an
// etcd stream, as etcdapi had: the native API's watches are one watch a
// stream, and a feed of one watch is the whole join with nothing to
// multiplex; an etcd stream runs one feed a watch, each on a goroutine of
// its own that hands batches to the stream's owner. The hub makes that
// cheap (a watcher is a cursor, not a copy of the events), and what the
// multiplexing cost etcdapi — a filter over every watch's range, a marker
// event to learn where the shared watcher stood, batches held back until
// a later revision or a target showed they were whole — is gone, as the
// feed learns that a revision is whole from the hub itself. The price
// would be a goroutine a watch woken by every publish, to look at the
// new events through its own filter: measured, a key event cost a stream
// of 1,000 watches 2.4 ms, against 0.14 ms with the shared watcher
// (etcdapi's BenchmarkWatchFanOut). So a feed gives its hub watcher a
// wake predicate (watch.Watcher.Want): the publisher wakes a waiting
// feed only for an event of its keys, or one at a Level asked for, and
// moves it past the rest, which also keeps a quiet watch from lagging.
// The same stream then pays 0.24 ms an event, the predicates run on the
// publishing goroutine instead of a wake-up each; the open-watch limits
// (frontend.Node.HoldWatch) bound how many there are.
//
// A predicate still costs every publish a call for every waiting feed:
// with 10^4 idle watches, each of its own key, a Lock+Unlock went from
// 1.4 ms to 11 ms. A watch of one key, the common case, is opened with
// OpenKey: its hub watcher is indexed by that key (watch.Watcher.WantKey)
// and a publish of other keys does no work for it. A Level asked for
// wakes a waiting feed of either kind through watch.Watcher.WakeAt, so
// that no predicate has to watch for it.
package keyfeed

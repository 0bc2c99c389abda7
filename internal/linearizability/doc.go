// Package linearizability records histories of calls against a Tenure
// cluster and checks them with porcupine against sequential models of
// the key/value store (put, get, compare-and-swap on the value) and of
// leases (acquire, release, validate with fencing tokens).
//
// A mutation whose outcome the caller cannot know — a timeout, a cut
// connection, the client's ErrUnknownOutcome — may or may not have taken
// effect, at any moment after it was called: it is recorded with Unknown
// set and a return time of infinity, and the models let it either happen
// or not, as etcd's robustness tests do. A read that failed changed
// nothing and tells nothing: callers leave it out of the history.
//
// The models know nothing of time, so sessions in a recorded lease
// history must not expire while it is recorded: an expiry is a state
// change that no call in the history explains.
package linearizability

package client

import "time"

// WithPipelinePings shortens how long a pipeline with calls in flight
// may stay silent before it is pinged, and then before it is given up
// (pingEvery and pingTimeout, 5s each), so that the watchdog's tests
// take a second rather than a quarter of a minute.
func WithPipelinePings(every, timeout time.Duration) Option {
	return func(o *options) { o.pingEvery, o.pingTimeout = every, timeout }
}

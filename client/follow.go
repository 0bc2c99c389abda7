package client

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
)

// follow feeds a watch stream to deliver, in revision order from
// revision from, resuming after the last revision delivered when a
// stream or an endpoint fails. It ends when ctx ends, deliver returns
// false, or on a failure a reconnect cannot fix — the history no longer
// has the next revision, the request is invalid, or every retry failed —
// which it hands to fail.
func follow[M any](ctx context.Context, c *Client, op string, from int64,
	open func(ctx context.Context, ep *endpoint, from int64) (*connect.ServerStreamForClient[M], error),
	deliver func(msg *M) (revision int64, more bool),
	fail func(error),
) {
	failures := 0
	for ctx.Err() == nil {
		ep, err := c.endpoint()
		if err != nil {
			fail(wrap(op, err))
			return
		}
		st, err := open(ctx, ep, from)
		if err == nil {
			for st.Receive() {
				failures = 0
				rev, more := deliver(st.Msg())
				from = rev + 1
				if !more {
					st.Close()
					return
				}
			}
			err = st.Err()
			st.Close()
		}
		if ctx.Err() != nil {
			return
		}
		werr := wrap(op, err)
		if errors.Is(werr, ErrLagged) || errors.Is(werr, ErrInvalidArgument) {
			fail(werr)
			return
		}
		if failures++; failures >= c.opts.maxAttempts {
			fail(fmt.Errorf("%w: %w", ErrUnavailable, werr))
			return
		}
		c.failover(ep, err)
		if !sleep(ctx, c.opts.backoff) {
			return
		}
	}
}

// currentRevision pins where a watch "from now" starts, so that a
// reconnect resumes rather than skips.
func (c *Client) currentRevision(ctx context.Context) (int64, error) {
	_, rev, _, err := c.KV().Range(ctx, "", 1)
	return rev, err
}

// watchInto starts a watch that sends converted messages, in revision
// order, on the returned channel, and closes it when ctx ends or after
// sending errEvent for the error that ended the watch. from == 0 means
// "from now", pinned before watchInto returns, so that every change made
// once it has returned is sent.
func watchInto[M, E any](ctx context.Context, c *Client, op string, from int64,
	open func(ctx context.Context, ep *endpoint, from int64) (*connect.ServerStreamForClient[M], error),
	convert func(msg *M) (revision int64, ev E),
	errEvent func(error) E,
) <-chan E {
	var pinErr error
	if from == 0 {
		var rev int64
		if rev, pinErr = c.currentRevision(ctx); pinErr == nil {
			from = rev + 1
		}
	}
	out := make(chan E, 16)
	go func() {
		defer close(out)
		send := func(ev E) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if pinErr != nil {
			send(errEvent(pinErr))
			return
		}
		follow(ctx, c, op, from, open,
			func(msg *M) (int64, bool) {
				rev, ev := convert(msg)
				return rev, send(ev)
			},
			func(err error) { send(errEvent(err)) })
	}()
	return out
}

package client

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
)

// follow feeds a watch stream to deliver, in revision order from
// revision from, resuming where it stopped when a stream or an endpoint
// fails: at the last revision delivered, whose events it had already
// delivered are skipped, since the events of one command may share a
// revision (keys' KV revision) and the stream may have broken between
// them. It ends when ctx ends, deliver returns
// false, or on a failure a reconnect cannot fix — the history no longer
// has the next revision, the request is invalid, or every retry failed —
// which it hands to fail.
func follow[M any](ctx context.Context, c *Client, op string, from int64,
	open func(ctx context.Context, ep *endpoint, from int64) (*connect.ServerStreamForClient[M], error),
	deliver func(msg *M) (revision int64, more bool),
	fail func(error),
) {
	failures := 0
	// last is the revision of the last message delivered and seen how
	// many were delivered at it; a resumed stream replays them first.
	var last int64
	seen := 0
	for ctx.Err() == nil {
		ep, err := c.endpoint()
		if err != nil {
			fail(wrap(op, err))
			return
		}
		st, err := open(ctx, ep, from)
		if err == nil {
			skip := 0
			if from == last && last > 0 {
				skip = seen
			}
			for st.Receive() {
				failures = 0
				if skip > 0 {
					skip--
					continue
				}
				rev, more := deliver(st.Msg())
				if rev == last {
					seen++
				} else {
					last, seen = rev, 1
				}
				from = last
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
// reconnect resumes rather than skips: the keys' revision for a key
// watch, the global revision for a lease watch (a server from before
// keys had a clock of their own answers the one revision for both).
func (c *Client) currentRevision(ctx context.Context, global bool) (int64, error) {
	var rev int64
	err := c.do(ctx, "Range", idempotent, func(ctx context.Context, ep *endpoint) error {
		resp, err := ep.kv.Range(ctx, connect.NewRequest(&tenurev1.RangeRequest{Limit: 1}))
		if err != nil {
			return err
		}
		rev = resp.Msg.GetRevision()
		if g := resp.Msg.GetGlobalRevision(); global && g > 0 {
			rev = g
		}
		return nil
	})
	return rev, err
}

// watchInto starts a watch that sends converted messages, in revision
// order, on the returned channel, and closes it when ctx ends or after
// sending errEvent for the error that ended the watch. from == 0 means
// "from now", pinned before watchInto returns, so that every change made
// once it has returned is sent.
func watchInto[M, E any](ctx context.Context, c *Client, op string, from int64, global bool,
	open func(ctx context.Context, ep *endpoint, from int64) (*connect.ServerStreamForClient[M], error),
	convert func(msg *M) (revision int64, ev E),
	errEvent func(error) E,
) <-chan E {
	var pinErr error
	if from == 0 {
		var rev int64
		if rev, pinErr = c.currentRevision(ctx, global); pinErr == nil {
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

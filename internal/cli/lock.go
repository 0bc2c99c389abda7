package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

type lockOptions struct {
	grantOptions
	try      bool
	wait     time.Duration
	capacity int
}

// NewLockCommand builds `tenure lock`.
func NewLockCommand(g *globals) *cobra.Command {
	o := &lockOptions{}
	cmd := &cobra.Command{
		Use:   "lock NAME [-- CMD [ARGS...]]",
		Short: "Run a command while holding a lock",
		Long: `Acquire the lock NAME (waiting in the server's FIFO queue), then run CMD with
TENURE_LEASE, TENURE_FENCING_TOKEN and TENURE_HOLDER in its environment, and
without TENURE_TOKEN, tenure's credential, unless --pass-token.

CMD runs in its own process group. SIGINT and SIGTERM to tenure are forwarded
to the group. If the lock may be lost (heartbeats not acknowledged for 0.75 of
the TTL, the session ended, or the lock was revoked), the whole group gets
SIGTERM, then SIGKILL after --kill-grace, so the command never runs past the
point where someone else can hold the lock: --kill-grace must be under a
quarter of --ttl. Left out, it is --ttl/5 (at most 2s), and --lock-delay a
second more, so any --ttl works on its own. When CMD exits, the lock is
released and tenure exits with CMD's exit code.

The wait outlasts a server restart or a change of leader: only --wait, a
signal or the loss of the session ends it.

Without CMD, tenure holds the lock until interrupted and prints the token.
With --capacity N the lock is a semaphore with N places.`,
		Example: `  # Protect a cron job: at most one copy runs across all hosts
  tenure lock nightly-report -- ./report.sh

  # Give up at once if someone else holds it (exit code 1)
  tenure lock --try nightly-report -- ./report.sh

  # At most 3 concurrent renders, waiting at most a minute for a place
  tenure lock --capacity 3 --wait 1m render -- ./render.sh

  # The command can fence its writes with the token
  tenure lock db-migrate -- sh -c 'migrate --fencing-token "$TENURE_FENCING_TOKEN"'

  # A short TTL hands the lock on sooner after a crash; --kill-grace and
  # --lock-delay follow it (400ms and 1.4s here)
  tenure lock --ttl 2s heartbeat-sweep -- ./sweep.sh`,
		Args: cobra.MatchAll(cobra.MinimumNArgs(1), leaseNameArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if at := cmd.ArgsLenAtDash(); at > 1 || (at < 0 && len(args) > 1) {
				return usage("lock takes one NAME; put the command after --")
			}
			return runLock(cmd, g, o, args[0], args[1:])
		},
	}
	addGrantFlags(cmd, &o.grantOptions)
	f := cmd.Flags()
	f.BoolVar(&o.try, "try", false, "do not wait: exit 1 if the lock is held")
	f.DurationVar(&o.wait, "wait", 0, "wait at most this long for the lock (default: as long as it takes)")
	f.IntVar(&o.capacity, "capacity", 1, "places in the lock: more than 1 makes it a semaphore")
	return cmd
}

func runLock(cmd *cobra.Command, g *globals, o *lockOptions, name string, argv []string) error {
	if err := o.check(cmd); err != nil {
		return err
	}
	if o.capacity < 1 {
		return usage("--capacity %d must be at least 1", o.capacity)
	}
	if o.wait < 0 {
		return usage("--wait %v must not be negative", o.wait)
	}
	ctx := cmd.Context()
	c, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := o.session(ctx, c)
	if err != nil {
		return err
	}
	defer closeSession(s)

	sem := s.Semaphore(name, o.capacity, o.leaseOptions(g.namespace)...)
	acquireCtx, cancel := ctx, context.CancelFunc(func() {})
	if o.wait > 0 {
		acquireCtx, cancel = context.WithTimeout(ctx, o.wait)
	}
	// Only ctx, --wait or the session's loss ends a wait: the client
	// rides out a server restart or a change of leader on its own.
	if o.try {
		err = sem.TryAcquire(acquireCtx)
	} else {
		err = sem.Acquire(acquireCtx)
	}
	// Read before cancel, which would make every failure look like
	// --wait running out.
	waitedOut := acquireCtx.Err() != nil
	cancel()
	switch {
	case errors.Is(err, client.ErrLocked):
		return unmet(err) // "default/NAME is held by ..."
	case err != nil && ctx.Err() != nil:
		return unmet(fmt.Errorf("interrupted while waiting for %s", g.lease(name)))
	case err != nil && waitedOut:
		return unmet(fmt.Errorf("gave up waiting for %s after %v", g.lease(name), o.wait))
	case err != nil:
		return unreachable(err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
		defer cancel()
		_ = sem.Release(rctx)
	}()
	token, _ := sem.Token()
	if len(argv) == 0 {
		return holdUntilInterrupted(cmd, ctx, token, s.Identity(), sem.Lost())
	}
	_, err = o.runUnderGrant(cmd, g, sem.Context(), s.Identity(), argv, func(t client.Token, cause error) error {
		return fmt.Errorf("lost %s (token %d) while the command ran; it was stopped: %v", t.Lease(), t.Token, cause)
	})
	return err
}

// holdUntilInterrupted prints the grant and keeps it until a signal or
// its loss.
func holdUntilInterrupted(cmd *cobra.Command, ctx context.Context, t client.Token, holder string, lost <-chan struct{}) error {
	fmt.Fprintf(cmd.OutOrStdout(), "%s held by %s with fencing token %d; interrupt to release\n", t.Lease(), holder, t.Token)
	select {
	case <-ctx.Done():
		return nil
	case <-lost:
		return unmet(fmt.Errorf("lost %s (token %d)", t.Lease(), t.Token))
	}
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

type electOptions struct {
	grantOptions
	value   string
	retry   bool
	observe bool
	leader  bool
}

// NewElectCommand builds `tenure elect`.
func NewElectCommand(g *globals) *cobra.Command {
	o := &electOptions{}
	cmd := &cobra.Command{
		Use:   "elect NAME [-- CMD [ARGS...]]",
		Short: "Run a command while leader, or observe an election",
		Long: `Campaign in the election NAME; once leader, run CMD with TENURE_LEASE,
TENURE_FENCING_TOKEN and TENURE_HOLDER in its environment, proclaiming
--value (e.g. this instance's address) to everyone who asks who leads.

CMD is supervised as with 'tenure lock': signals are forwarded to its process
group, and if leadership may be lost the group is stopped (SIGTERM, then
SIGKILL after --kill-grace) before another candidate can be elected. With
--retry, tenure campaigns again after such a loss; otherwise it exits with
CMD's exit code. Like lock, a campaign waits through a server restart or a
change of leader; with --retry it also outlasts the loss of its session,
campaigning on with a new one.

--observe prints every leader change (identity, value, token) until
interrupted; --leader prints the current leader and exits (1 if none).`,
		Example: `  # Run the scheduler on exactly one host, re-campaigning after a loss
  tenure elect scheduler --value "$(hostname):8080" --retry -- ./scheduler

  # Who leads now?
  tenure elect scheduler --leader

  # Follow every change
  tenure elect scheduler --observe`,
		Args: cobra.MatchAll(cobra.MinimumNArgs(1), leaseNameArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if at := cmd.ArgsLenAtDash(); at > 1 || (at < 0 && len(args) > 1) {
				return usage("elect takes one NAME; put the command after --")
			}
			return runElect(cmd, g, o, args[0], args[1:])
		},
	}
	addGrantFlags(cmd, &o.grantOptions)
	f := cmd.Flags()
	f.StringVar(&o.value, "value", "", "value to proclaim while leader (e.g. an address)")
	f.BoolVar(&o.retry, "retry", false, "campaign again after the command is stopped by a loss, or the session is lost while waiting")
	f.BoolVar(&o.observe, "observe", false, "print every leader change until interrupted")
	f.BoolVar(&o.leader, "leader", false, "print the current leader and exit")
	cmd.MarkFlagsMutuallyExclusive("observe", "leader")
	return cmd
}

func runElect(cmd *cobra.Command, g *globals, o *electOptions, name string, argv []string) error {
	ctx := cmd.Context()
	if (o.observe || o.leader) && len(argv) > 0 {
		return usage("--observe and --leader take no command")
	}
	c, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	out := cmd.OutOrStdout()
	if o.leader || o.observe {
		// Observing needs no session: it only reads and watches.
		e := observer{c: c, lease: g.lease(name)}
		if o.leader {
			l, err := e.leader(ctx)
			if errors.Is(err, client.ErrNoLeader) {
				return unmet(fmt.Errorf("%s has no leader", g.lease(name)))
			}
			if err != nil {
				return unreachable(err)
			}
			fmt.Fprintln(out, formatLeader(l))
			return nil
		}
		// Observing rides out every failure, a refused request too: ask
		// once first, so that a bad namespace or name is an error
		// rather than a silent wait.
		if _, err := e.leader(ctx); errors.Is(err, client.ErrInvalidArgument) {
			return err
		}
		for l := range e.observe(ctx) {
			fmt.Fprintln(out, formatLeader(l))
		}
		return nil
	}
	if len(argv) == 0 {
		return usage("elect needs a command after --, or --observe or --leader")
	}
	if err := o.check(cmd); err != nil {
		return err
	}
	if o.retry {
		return campaignRetrying(cmd, g, o, c, name, argv)
	}
	_, err = campaignOnce(cmd, g, o, c, name, argv)
	return err
}

// lostLeadership is elect's error after a loss, or after being asked to
// step down for the lease's preferred holder.
func lostLeadership(lease client.LeaseName) func(client.Token, error) error {
	return func(_ client.Token, cause error) error {
		if errors.Is(cause, client.ErrStepDown) {
			return fmt.Errorf("stepped down from %s (%v); the command was stopped", lease, cause)
		}
		return fmt.Errorf("lost leadership of %s; the command was stopped", lease)
	}
}

// campaignOnce opens a session, waits to be elected, runs the command and
// resigns. lost says whether leadership was lost while the command ran.
func campaignOnce(cmd *cobra.Command, g *globals, o *electOptions, c *client.Client, name string, argv []string) (lost bool, err error) {
	ctx := cmd.Context()
	s, err := o.session(ctx, c)
	if err != nil {
		return false, err
	}
	defer closeSession(s)
	e := s.Election(name, o.leaseOptions(g.namespace)...)
	if err := e.Campaign(ctx, o.value); err != nil {
		if ctx.Err() != nil {
			return false, unmet(fmt.Errorf("interrupted while campaigning for %s", g.lease(name)))
		}
		return false, unreachable(err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
		defer cancel()
		_ = e.Resign(rctx)
	}()
	return o.runUnderGrant(cmd, g, e.Context(), s.Identity(), argv, lostLeadership(g.lease(name)))
}

// campaignRetrying is elect --retry, driven by client.RunElection:
// it campaigns, runs the command whenever this process leads, and after a
// loss campaigns again — with a new session if the old one was lost,
// while leading or while waiting. It returns once the command exits on
// its own, or a signal ends a wait.
func campaignRetrying(cmd *cobra.Command, g *globals, o *electOptions, c *client.Client, name string, argv []string) error {
	ctx := cmd.Context()
	s, err := o.session(ctx, c)
	if err != nil {
		return err
	}
	defer closeSession(s)

	// RunElection does not get ctx, which a signal ends: while the
	// command runs, the signal is the command's to act on, and
	// RunElection would take ctx's end for a loss and stop the command.
	// A signal ends only a wait; the command's exit ends the rest.
	run, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	var (
		mu          sync.Mutex // guards the four below
		leading     bool
		interrupted bool
		finished    bool  // the command exited, and result is the exit
		result      error // what to exit with once finished
	)
	defer context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		interrupted = true
		if !leading {
			stop()
		}
	})()
	lead := func(grant context.Context) {
		mu.Lock()
		if interrupted {
			mu.Unlock()
			return // elected as the signal came: leave at once
		}
		leading = true
		mu.Unlock()
		lost, err := o.runUnderGrant(cmd, g, grant, s.Identity(), argv, lostLeadership(g.lease(name)))
		mu.Lock()
		defer mu.Unlock()
		leading = false
		if lost && !interrupted {
			fmt.Fprintf(cmd.ErrOrStderr(), "tenure: lost leadership of %s; the command was stopped; campaigning again\n", g.lease(name))
			return
		}
		finished, result = true, err
		stop()
	}
	err = client.RunElection(run, s, name, client.Callbacks{OnStartedLeading: lead},
		append(o.leaseOptions(g.namespace), client.WithValue(o.value))...)
	mu.Lock()
	defer mu.Unlock()
	switch {
	case finished:
		return result
	case interrupted:
		return unmet(fmt.Errorf("interrupted while campaigning for %s", g.lease(name)))
	}
	return unreachable(err)
}

// observer reads an election without campaigning in it.
type observer struct {
	c     *client.Client
	lease client.LeaseName
}

func (o observer) leader(ctx context.Context) (client.Leader, error) {
	return o.c.ElectionLeader(ctx, o.lease.Namespace, o.lease.Name)
}

func (o observer) observe(ctx context.Context) <-chan client.Leader {
	return o.c.ObserveElection(ctx, o.lease.Namespace, o.lease.Name)
}

func formatLeader(l client.Leader) string {
	if l.Identity == "" {
		return fmt.Sprintf("revision=%d leader=<none>", l.Revision)
	}
	return fmt.Sprintf("revision=%d leader=%s value=%q token=%d", l.Revision, l.Identity, l.Value, l.Token)
}

package cli

// What lock and elect share: the grant flags, the session behind a grant,
// and running a command under one.

import (
	"context"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// grantOptions are the flags lock and elect share.
type grantOptions struct {
	ttl       time.Duration
	killGrace time.Duration
	lockDelay time.Duration
	identity  string
	gcAfter   time.Duration
	gcSet     bool // --gc-after was given
	maxHold   time.Duration
	passToken bool // give the command TENURE_TOKEN
}

func addGrantFlags(cmd *cobra.Command, o *grantOptions) {
	f := cmd.Flags()
	f.DurationVar(&o.ttl, "ttl", 10*time.Second, "session TTL: how long after the last heartbeat the server releases the grant")
	// The defaults of --kill-grace and --lock-delay follow --ttl (see
	// check); --help shows the rule instead of a value.
	f.DurationVar(&o.killGrace, "kill-grace", 0, "time between SIGTERM and SIGKILL when the grant may be lost; must be under a quarter of --ttl")
	f.Lookup("kill-grace").DefValue = "--ttl/5, at most 2s"
	f.DurationVar(&o.lockDelay, "lock-delay", 0, "after an expiry or revoke, how long nobody may be granted")
	f.Lookup("lock-delay").DefValue = "--kill-grace + 1s"
	f.StringVar(&o.identity, "identity", "", "holder identity (default hostname_pid_random)")
	f.DurationVar(&o.gcAfter, "gc-after", 0, "keep the lease record this long once nothing holds or waits for it; 0 keeps it forever")
	f.Lookup("gc-after").DefValue = "the server's --lease-gc-after"
	f.BoolVar(&o.passToken, "pass-token", false, "give the command TENURE_TOKEN, the bearer token tenure authenticates with (by default the command does not get it)")
	f.DurationVar(&o.maxHold, "max-hold", 0, "hold the grant at most this long: past it the command is stopped as on a loss, and the server revokes the grant after its --max-hold-grace (0: no limit)")
}

// leaseOptions are the options of the lease that lock or elect takes.
func (o *grantOptions) leaseOptions(namespace string) []client.LeaseOption {
	opts := []client.LeaseOption{client.WithNamespace(namespace), client.WithLockDelay(o.lockDelay)}
	if o.gcSet {
		opts = append(opts, client.WithGCAfter(o.gcAfter))
	}
	if o.maxHold > 0 {
		opts = append(opts, client.WithMaxHold(o.maxHold))
	}
	return opts
}

// validityFactor is the share of the TTL, after the last acknowledged
// heartbeat was sent, during which the CLI trusts its grant.
const validityFactor = 0.75

// maxDefaultKillGrace caps the default --kill-grace: beyond it a longer
// TTL buys a larger margin, not a longer wait for a stuck command.
const maxDefaultKillGrace = 2 * time.Second

// check keeps the promise that the child is stopped before anyone else
// can hold the grant: it is told to stop when validity ends, at
// 0.75×TTL, and killed killGrace later, which must come before the
// server can expire the session at 1×TTL. It fills in the kill-grace and
// lock-delay that cmd's flags left unset: TTL/5, at most 2s, leaves at
// least TTL/20 of margin for scheduling delays (100ms at the server's
// minimum TTL of 2s, 500ms at the default 10s), and any TTL gets a
// kill-grace that fits; the lock-delay is a second more than the grace.
// A value given explicitly is checked, never adjusted.
func (o *grantOptions) check(cmd *cobra.Command) error {
	if o.ttl <= 0 {
		return usage("--ttl %v must be positive", o.ttl)
	}
	if !cmd.Flags().Changed("kill-grace") {
		o.killGrace = min(o.ttl/5, maxDefaultKillGrace)
	}
	if o.killGrace <= 0 {
		return usage("--kill-grace %v must be positive", o.killGrace)
	}
	margin := time.Duration(float64(o.ttl) * (1 - validityFactor))
	if o.killGrace >= margin {
		return usage("--kill-grace %v must be under %v (a quarter of --ttl %v): the command must be dead before the server can expire the session", o.killGrace, margin, o.ttl)
	}
	if !cmd.Flags().Changed("lock-delay") {
		o.lockDelay = o.killGrace + time.Second
	}
	if o.lockDelay < 0 {
		return usage("--lock-delay %v must not be negative", o.lockDelay)
	}
	o.gcSet = cmd.Flags().Changed("gc-after")
	if o.gcAfter < 0 {
		return usage("--gc-after %v must not be negative", o.gcAfter)
	}
	if o.maxHold < 0 {
		return usage("--max-hold %v must not be negative", o.maxHold)
	}
	return nil
}

func (o *grantOptions) session(ctx context.Context, c *client.Client) (*client.Session, error) {
	opts := []client.SessionOption{client.WithTTL(o.ttl), client.WithValidityFactor(validityFactor)}
	if o.identity != "" {
		opts = append(opts, client.WithIdentity(o.identity))
	}
	s, err := c.NewSession(ctx, opts...)
	return s, unreachable(err)
}

// runUnderGrant is the tail lock and elect share. It runs argv while the
// grant lasts — grant is the grant's context, cancelled the moment the
// grant may be lost, and carries its fencing token — supervised by child:
// its own process group, signals forwarded, and the group stopped before
// anyone else can be granted. It returns the error to exit with: nil or
// the command's exit code; after a loss, lostErr's error with a code that
// is never 0, and lost = true.
func (o *grantOptions) runUnderGrant(cmd *cobra.Command, g *globals, grant context.Context, holder string, argv []string,
	lostErr func(t client.Token, cause error) error) (lost bool, err error) {
	t, _ := client.TokenFromContext(grant)
	env := grantEnv(t, holder, g.endpoints)
	if o.passToken && g.token != "" {
		env = append(env, tokenEnv+"="+g.token)
	}
	ch := &child{
		args:      argv,
		env:       env,
		unset:     []string{tokenEnv},
		killGrace: o.killGrace,
		stdin:     cmd.InOrStdin(),
		stdout:    cmd.OutOrStdout(),
		stderr:    cmd.ErrOrStderr(),
	}
	code, lost, err := ch.run(grant.Done())
	switch {
	case err != nil:
		return false, &exitError{code: code, err: err}
	case lost:
		return true, &exitError{code: lostCode(code), err: lostErr(t, context.Cause(grant))}
	}
	return false, exitCodeErr(code)
}

// tokenEnv holds the bearer token tenure authenticates with. The command
// under a grant does not get it unless --pass-token asks: it is tenure's
// credential, and a job needs none to fence its writes with the token
// in TENURE_FENCING_TOKEN, while anything it runs (or leaks its
// environment to) could use it to lock, write or revoke as tenure may.
const tokenEnv = "TENURE_TOKEN"

func grantEnv(t client.Token, holder, endpoints string) []string {
	return []string{
		"TENURE_LEASE=" + t.Lease().String(),
		"TENURE_FENCING_TOKEN=" + strconv.FormatInt(t.Token, 10),
		"TENURE_HOLDER=" + holder,
		"TENURE_ENDPOINTS=" + endpoints,
	}
}

// lostCode is the exit code after a loss: the command's, but never 0,
// even when the command exits cleanly on SIGTERM — it did not finish
// under the grant, and a script must not carry on as if it had.
func lostCode(code int) int {
	if code == 0 {
		return ExitUnmet
	}
	return code
}

func exitCodeErr(code int) error {
	if code == 0 {
		return nil
	}
	return &exitError{code: code}
}

func closeSession(s *client.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Close(ctx)
}

// Package cli holds the tenure command tree. main only hands off to Main,
// so end-to-end tests drive the same code the binary runs.
package cli

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tenurehq/tenure/internal/certs"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/client"
)

// Exit codes, documented in docs/cli.md.
const (
	ExitOK          = 0
	ExitUnmet       = 1 // a condition was not met: compare failed, lock held, token invalid
	ExitUsage       = 2
	ExitUnreachable = 3
)

// exitError carries an exit code out of a command's RunE. A nil err
// exits quietly (the command printed what it had to say).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// Main runs the tenure command line and returns the process exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Signals are caught here so that commands can shut down cleanly;
	// lock and elect forward them to their child instead.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := NewRootCommand()
	for _, w := range envWarnings(root, os.Environ()) {
		fmt.Fprintln(stderr, "Warning:", w)
	}
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	if hint, code, ok := tlsHint(err); ok {
		fmt.Fprintf(stderr, "Error: %v\n%s\n", err, hint)
		return code
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "Error:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "Error:", err)
	switch {
	case errors.Is(err, client.ErrUnavailable):
		return ExitUnreachable
	case errors.Is(err, client.ErrInvalidArgument):
		// The server checks some arguments only it can judge (a
		// namespace, a TTL within its limits, a label selector): its
		// refusal is a usage error like the CLI's own.
		return ExitUsage
	case errors.Is(err, client.ErrLocked), errors.Is(err, client.ErrCompareFailed),
		errors.Is(err, client.ErrNotFound), errors.Is(err, client.ErrNotHolder):
		return ExitUnmet
	}
	var ce *client.Error
	if errors.As(err, &ce) {
		return ExitUnmet
	}
	return ExitUsage
}

// tlsHint says what to do about a failure that comes from the client's
// and the server's TLS settings not matching, and the exit code it
// deserves: the server answered, so these are not "unreachable" (3) but
// a missing flag (2), or credentials the server did not accept (1, as a
// policy's refusal). ok is false for any other failure.
func tlsHint(err error) (hint string, code int, ok bool) {
	var unknownCA x509.UnknownAuthorityError
	var wrongHost x509.HostnameError
	var remote *net.OpError
	switch {
	case errors.As(err, &unknownCA):
		return "The server's certificate is not signed by a CA tenure was told to trust: pass the CA that signed it with --cacert or TENURE_CACERT (tenure certs init writes it as ca.pem).", ExitUsage, true
	case errors.As(err, &wrongHost):
		return "The server's certificate does not name the address in --endpoints: use an endpoint named in it.", ExitUsage, true
	case errors.As(err, &remote) && remote.Op == "remote error" && strings.Contains(remote.Err.Error(), "certificate"):
		// crypto/tls reports the server's alert ("tls: bad certificate",
		// "tls: certificate required") only as text, in an unexported
		// type.
		return "The server did not accept this client's certificate, or wants one: pass --cert and --key (or TENURE_CERT, TENURE_KEY) with a certificate from the server's client CA.", ExitUnmet, true
	case strings.Contains(err.Error(), "Client sent an HTTP request to an HTTPS server"):
		// net/http's fixed answer to cleartext on a TLS port, which
		// reaches the client only as the body of a 400.
		return "The server speaks TLS: pass the CA that signed its certificate with --cacert or TENURE_CACERT, or give the endpoint as https://HOST:PORT.", ExitUsage, true
	}
	return "", 0, false
}

// globals are the flags every command shares.
type globals struct {
	endpoints     string
	cacert        string
	cert, key     string
	token         string
	timeout       time.Duration
	output        string
	namespace     string
	allNamespaces bool
}

// NewRootCommand builds the whole command tree.
func NewRootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "tenure",
		Short: "Distributed locks, leases, semaphores and leader election with fencing tokens",
		Long: `tenure runs a Tenure server (tenure serve) and talks to one: run a command
while holding a lock or leadership, list who holds what, validate fencing
tokens, and use the key/value layer.

Exit codes: 0 ok; 1 a condition was not met (compare failed, lock held with
--try, token not valid, not found); 2 usage error or bad argument, also one
the server refuses; 3 server unreachable;
lock and elect exit with their command's exit code (1 if the command exited 0
after the grant was lost).`,
		Example: `  # Start a server, then run a job under a lock
  tenure serve &
  tenure lock nightly-report -- ./report.sh

  # Run on exactly one host at a time, publishing this host's address
  tenure elect scheduler --value "$(hostname):8080" -- ./scheduler

  # Who holds what
  tenure get leases -A`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &exitError{code: ExitUsage, err: fmt.Errorf("%w\nSee '%s --help'.", err, cmd.CommandPath())}
	})
	pf := root.PersistentFlags()
	defaultEndpoints := os.Getenv("TENURE_ENDPOINTS")
	if defaultEndpoints == "" {
		defaultEndpoints = "127.0.0.1:7480"
	}
	pf.StringVar(&g.endpoints, "endpoints", defaultEndpoints, "comma-separated server endpoints (env TENURE_ENDPOINTS)")
	pf.DurationVar(&g.timeout, "timeout", 5*time.Second, "timeout of each request that does not wait by design")
	pf.StringVar(&g.cacert, "cacert", os.Getenv("TENURE_CACERT"), "talk TLS, checking servers against this PEM CA (env TENURE_CACERT)")
	pf.StringVar(&g.cert, "cert", os.Getenv("TENURE_CERT"), "TLS client certificate, PEM (env TENURE_CERT)")
	pf.StringVar(&g.key, "key", os.Getenv("TENURE_KEY"), "the PEM private key of --cert (env TENURE_KEY)")
	pf.StringVar(&g.token, "token", os.Getenv("TENURE_TOKEN"), "bearer token to authenticate with (env TENURE_TOKEN, which keeps it out of the process list)")
	pf.StringVarP(&g.namespace, "namespace", "n", client.DefaultNamespace, "lease namespace")

	root.AddGroup(
		&cobra.Group{ID: "run", Title: "Run under a lock or leadership:"},
		&cobra.Group{ID: "inspect", Title: "Inspect and administer:"},
		&cobra.Group{ID: "keys", Title: "Keys:"},
		&cobra.Group{ID: "server", Title: "Server:"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add("run", NewLockCommand(g), NewElectCommand(g), NewHeartbeatCommand(g))
	add("inspect", NewGetCommand(g), NewValidateCommand(g), NewValidateKeyCommand(g), NewRevokeCommand(g), NewLeaseCommand(g), NewWatchCommand(g))
	add("keys", NewKVCommand(g), NewEtcdCommand(g))
	add("server", NewServeCommand(), NewMembersCommand(g), NewSnapshotCommand(g), NewDevCommand(), NewBenchCommand(), NewCertsCommand(), NewAuthCommand())
	root.AddCommand(NewVersionCommand())
	// --version prints what `tenure version` prints.
	root.Version = strings.TrimSuffix(readBuildInfo().String(), "\n")
	root.SetVersionTemplate("{{.Version}}\n")
	explainArgs(root)
	return root
}

// explainArgs makes a wrong number of arguments, to cmd and every command
// under it, a usage error that names what is missing and shows the usage
// line, instead of cobra's bare "requires at least 1 arg(s), only
// received 0". An error a check words itself (a bad lease name, an
// unknown subcommand) passes through.
func explainArgs(cmd *cobra.Command) {
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			err := check(c, args)
			var ee *exitError
			if err == nil || errors.As(err, &ee) {
				return err
			}
			required, optional := useArgs(c.Use)
			switch {
			case len(args) < len(required):
				err = fmt.Errorf("%s: missing %s", c.CommandPath(), strings.Join(required[len(args):], " and "))
			case len(required)+optional == 0:
				return usage("%v", err) // "unknown command": its own words say it
			default:
				err = fmt.Errorf("%s: too many arguments (%d)", c.CommandPath(), len(args))
			}
			return usage("%v\nUsage: %s\nSee '%s --help'.", err, c.UseLine(), c.CommandPath())
		}
	}
	for _, sub := range cmd.Commands() {
		explainArgs(sub)
	}
}

// useArgs reads the arguments of a Use line ("lock NAME [-- CMD
// [ARGS...]]", "validate NAME --token N"): the required ones by name, and
// how many optional groups follow. A word after a flag is its value.
func useArgs(use string) (required []string, optional int) {
	words := strings.Fields(use)
	depth, flagValue := 0, false
	for _, w := range words[min(1, len(words)):] {
		open := strings.HasPrefix(w, "[")
		if open && depth == 0 {
			optional++
		}
		depth += strings.Count(w, "[") - strings.Count(w, "]")
		switch {
		case open || depth > 0 || strings.HasSuffix(w, "]"):
		case strings.HasPrefix(w, "-"):
			flagValue = true
			continue
		case !flagValue:
			required = append(required, w)
		}
		flagValue = false
	}
	return required, optional
}

// addOutputFlags adds -o and -A to commands that list.
func addOutputFlags(cmd *cobra.Command, g *globals, formats string) {
	cmd.Flags().StringVarP(&g.output, "output", "o", "", "output format: "+formats)
}

func addAllNamespacesFlag(cmd *cobra.Command, g *globals) {
	cmd.Flags().BoolVarP(&g.allNamespaces, "all-namespaces", "A", false, "across all namespaces")
}

// connect returns a client for --endpoints.
func (g *globals) connect(ctx context.Context) (*client.Client, error) {
	var eps []string
	for e := range strings.SplitSeq(g.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, &exitError{code: ExitUsage, err: errors.New("--endpoints is empty")}
	}
	if g.timeout < 0 {
		return nil, usage("--timeout %v must not be negative", g.timeout)
	}
	opts := []client.Option{
		client.WithRequestTimeout(g.timeout),
		client.WithRetry(3, 100*time.Millisecond),
		client.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
	}
	if g.cacert != "" || g.cert != "" || g.key != "" {
		cfg, err := certs.ClientConfig(g.cacert, g.cert, g.key)
		if err != nil {
			return nil, usage("%v", err)
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	if g.token != "" {
		opts = append(opts, client.WithToken(g.token))
	}
	return client.New(ctx, eps, opts...)
}

// unreachable marks a failure to reach any endpoint with exit code 3.
func unreachable(err error) error {
	if errors.Is(err, client.ErrUnavailable) {
		return &exitError{code: ExitUnreachable, err: err}
	}
	return err
}

// usage is a usage error: exit code 2.
func usage(format string, args ...any) error {
	return &exitError{code: ExitUsage, err: fmt.Errorf(format, args...)}
}

// leaseNameArg checks a command's lease NAME argument, the first, in
// --namespace, by client.LeaseName's rules (the server's), before
// anything is sent. A name holding '/' is most likely "namespace/name"
// meant as -n namespace name, which the usage error says.
func leaseNameArg(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	ns, _ := cmd.Flags().GetString("namespace")
	if derivedNamespace(ns) {
		return nil // any name its keys give it, looked up in the list
	}
	err := client.LeaseName{Namespace: ns, Name: args[0]}.Validate()
	if errors.Is(err, api.ErrSlashInName) {
		ns, name, _ := strings.Cut(args[0], "/")
		return usage("lease name %q may not contain '/': give the namespace with -n, e.g. -n %s %s", args[0], ns, name)
	}
	if err != nil {
		return usage("%v", err)
	}
	return nil
}

// lease is the lease NAME in --namespace.
func (g *globals) lease(name string) client.LeaseName {
	return client.LeaseName{Namespace: g.namespace, Name: name}
}

// unmet is a condition that did not hold: exit code 1.
func unmet(err error) error { return &exitError{code: ExitUnmet, err: err} }

// withClient connects to --endpoints, runs fn with the command's context
// and the client, and closes the client.
func (g *globals) withClient(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	ctx := cmd.Context()
	c, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}

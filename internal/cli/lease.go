package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewLeaseCommand builds `tenure lease`, the administrative settings of
// a lease.
func NewLeaseCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lease",
		Short: "Administer a lease: its preferred holder",
		Example: `  tenure lease prefer scheduler sched-2
  tenure lease prefer scheduler --clear`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	var clear bool
	prefer := &cobra.Command{
		Use:   "prefer NAME [IDENTITY]",
		Short: "Name the identity a lease prefers as holder, or --clear it",
		Long: `Name the holder identity the lease NAME prefers, like Kubernetes' spec.preferredHolder:
while a session with that identity waits for the lease it is granted next,
ahead of the queue, and the holders in its way are asked to step down — a
'tenure elect' stops its command and resigns, a Go client's grant is lost
with ErrStepDown. Never a safety bypass: a holder keeps its grant until it
releases it or its session ends, and its fencing token stays valid until
then. Use it to move leadership back to an upgraded node, or to pin a
shard's owner. Needs the admin verb, and every member on this version.`,
		Example: `  tenure lease prefer scheduler sched-2     # hand leadership to sched-2 once it waits
  tenure lease prefer scheduler --clear     # back to first come, first served
  tenure get lease scheduler -o yaml        # spec.preferredHolder`,
		Args: cobra.MatchAll(cobra.RangeArgs(1, 2), leaseNameArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			identity := ""
			switch {
			case clear && len(args) == 2:
				return usage("give IDENTITY or --clear, not both")
			case !clear && len(args) == 1:
				return usage("prefer needs an IDENTITY, or --clear")
			case len(args) == 2:
				identity = args[1]
				if identity == "" {
					return usage("IDENTITY must not be empty; use --clear")
				}
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				l, err := c.SetPreferredHolder(ctx, g.namespace, args[0], identity)
				if err != nil {
					return unreachable(err)
				}
				out := cmd.OutOrStdout()
				if identity == "" {
					fmt.Fprintf(out, "%s: preferred holder cleared\n", g.lease(args[0]))
					return nil
				}
				fmt.Fprintf(out, "%s: preferred holder %s", g.lease(args[0]), identity)
				switch {
				case l.Holder == identity:
					fmt.Fprintln(out, " (holds it)")
				case len(l.Holders) > 0:
					fmt.Fprintf(out, " (held by %s; it steps down once %s waits)\n", holderList(l), identity)
				default:
					fmt.Fprintln(out)
				}
				return nil
			})
		},
	}
	prefer.Flags().BoolVar(&clear, "clear", false, "clear the preferred holder")
	cmd.AddCommand(prefer)
	return cmd
}

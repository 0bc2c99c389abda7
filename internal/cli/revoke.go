package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewRevokeCommand builds `tenure revoke`.
func NewRevokeCommand(g *globals) *cobra.Command {
	var (
		reason string
		token  int64
	)
	cmd := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Break a lock: end its grants, recording why",
		Long: `Administrative break-lock: end every grant of the lease NAME (or only the one
with --token), record the reason in the lease's event stream, and grant the
next waiter — after the lease's lock-delay, if it has one, so that a holder
supervised by 'tenure lock' is stopped first.`,
		Example: `  tenure revoke nightly-report --reason "wedged since 02:00, paged on-call"`,
		Args:    cobra.MatchAll(cobra.ExactArgs(1), leaseNameArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				revoked, err := c.Revoke(ctx, g.namespace, args[0], token, reason)
				if err != nil {
					return unreachable(err)
				}
				for _, t := range revoked {
					fmt.Fprintf(cmd.OutOrStdout(), "revoked %s token %d\n", g.lease(args[0]), t)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the revoke")
	cmd.Flags().Int64Var(&token, "token", 0, "revoke only this grant (default: every holder)")
	return cmd
}

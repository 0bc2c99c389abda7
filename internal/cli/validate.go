package cli

import (
	"context"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewValidateCommand builds `tenure validate`.
func NewValidateCommand(g *globals) *cobra.Command {
	var token int64
	cmd := &cobra.Command{
		Use:   "validate NAME --token N",
		Short: "Check whether a fencing token is the current holder's",
		Long: `Exit 0 if N is a current holder's fencing token of the lease NAME, 1
otherwise, printing the current holder and token. The answer is
linearizable: a token is never reported valid after its successor was
granted.`,
		Example: `  tenure validate nightly-report --token 42 && echo "still the owner"`,
		Args:    cobra.MatchAll(cobra.ExactArgs(1), leaseNameArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if token <= 0 {
				return usage("--token must be a positive fencing token")
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				l, err := c.Lease(ctx, g.namespace, args[0])
				if err != nil {
					return unreachable(err)
				}
				var tokens []int64
				for _, h := range l.Holders {
					tokens = append(tokens, h.Token)
				}
				out := cmd.OutOrStdout()
				if slices.Contains(tokens, token) {
					fmt.Fprintf(out, "valid: token %d holds %s (holder %s)\n", token, l.LeaseName(), l.Holder)
					return nil
				}
				if l.Holder == "" {
					fmt.Fprintf(out, "not valid: %s has no holder\n", l.LeaseName())
				} else {
					fmt.Fprintf(out, "not valid: the current holder of %s is %s with token %d\n", l.LeaseName(), l.Holder, l.Token)
				}
				return &exitError{code: ExitUnmet}
			})
		},
	}
	cmd.Flags().Int64Var(&token, "token", 0, "the fencing token to check")
	_ = cmd.MarkFlagRequired("token")
	return cmd
}

package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewValidateKeyCommand builds `tenure validate-key`.
func NewValidateKeyCommand(g *globals) *cobra.Command {
	var revision int64
	cmd := &cobra.Command{
		Use:   "validate-key KEY --revision N",
		Short: "Check whether an etcd-style lock key is still its holder's",
		Long: `Exit 0 if KEY exists as it was at KV revision N — created then or before,
and not deleted since — so that the holder of a lock taken through etcd's
recipes (etcdctl lock, a clientv3 Mutex, the Lock service) was not
replaced; 1 otherwise, saying why. N is the key's create revision or a
later revision the holder held it at, such as etcdctl lock's
ETCD_LOCK_REV. The answer is linearizable.`,
		Example: `  tenure validate-key "$ETCD_LOCK_KEY" --revision "$ETCD_LOCK_REV" && echo "still the owner"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := args[0]
			if key == "" {
				return usage("KEY must not be empty")
			}
			if revision <= 0 {
				return usage("--revision must be a positive KV revision")
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.ValidateKey(ctx, key, revision)
				if err != nil {
					return unreachable(err)
				}
				out := cmd.OutOrStdout()
				switch {
				case r.Valid:
					fmt.Fprintf(out, "valid: %s is held as created at revision %d (KV revision %d)\n", key, r.CreateRevision, r.KVRevision)
					return nil
				case r.CreateRevision == 0:
					fmt.Fprintf(out, "not valid: %s does not exist (the lock was released or its lease ended)\n", key)
				case r.CreateRevision > revision:
					fmt.Fprintf(out, "not valid: a newer holder made %s at revision %d\n", key, r.CreateRevision)
				default:
					fmt.Fprintf(out, "not valid: revision %d is later than the keys' current revision %d\n", revision, r.KVRevision)
				}
				return &exitError{code: ExitUnmet}
			})
		},
	}
	cmd.Flags().Int64Var(&revision, "revision", 0, "a KV revision the holder held KEY at (its create revision, or ETCD_LOCK_REV)")
	_ = cmd.MarkFlagRequired("revision")
	return cmd
}

package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewHeartbeatCommand builds `tenure heartbeat`.
func NewHeartbeatCommand(g *globals) *cobra.Command {
	var (
		ttl      time.Duration
		labels   map[string]string
		identity string
		gcAfter  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "heartbeat NODE",
		Short: "Keep a node lease held while this runs (Kubernetes node heartbeats)",
		Long: `Hold the lease NODE in the node-lease namespace (-n to change it) for as long
as this command runs, the way each kubelet renews its Lease in kube-node-lease,
but with a session instead of a renew timestamp: the server knows the node is
gone when its heartbeats stop for --ttl, without anyone comparing clocks.

SIGTERM or SIGINT closes the session, which releases the lease at once: the
record says "Released". A node that dies (kill -9, power loss) is released
after --ttl: the record says "Expired". After a lost session (a network cut
longer than --ttl) it takes the lease again by itself. Watch the namespace to
learn the moment a node's lease ends:

  tenure get leases -n node-lease         # which nodes are alive, since when the others are gone
  tenure watch -n node-lease              # every change as it happens`,
		Example: `  tenure heartbeat worker-7 -l zone=b -l pool=gpu
  tenure heartbeat worker-7 --ttl 10s`,
		Args: cobra.MatchAll(cobra.ExactArgs(1), leaseNameArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			if ttl <= 0 {
				return usage("--ttl %v must be positive", ttl)
			}
			if gcAfter < 0 {
				return usage("--gc-after %v must not be negative", gcAfter)
			}
			ns := g.namespace
			if !cmd.Flags().Changed("namespace") {
				ns = client.NodeLeaseNamespace
			}
			if identity == "" {
				identity = node
			}
			o := client.PresenceOptions{Namespace: ns, TTL: ttl, Identity: identity}
			if cmd.Flags().Changed("gc-after") {
				o.GCAfter = &gcAfter
			}
			out := cmd.ErrOrStderr()
			lease := client.LeaseName{Namespace: ns, Name: node}
			o.OnHeld = func(t client.Token) {
				fmt.Fprintln(out, heldLine(lease, t.Token, ttl))
			}
			o.OnLost = func(err error) {
				fmt.Fprintf(out, "tenure: %s was lost (%v); taking it again\n", lease, err)
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.Heartbeat(ctx, node, labels, o); err != nil {
					return unreachable(err)
				}
				fmt.Fprintf(out, "tenure: %s released\n", lease)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.DurationVar(&ttl, "ttl", client.DefaultNodeLeaseTTL, "session TTL: how long after the node dies its lease is released")
	f.StringToStringVarP(&labels, "label", "l", nil, "label the node lease, key=value (repeatable)")
	f.StringVar(&identity, "identity", "", "holder identity (default NODE)")
	f.DurationVar(&gcAfter, "gc-after", 0, "keep the record this long after the node is gone; 0 keeps it forever")
	f.Lookup("gc-after").DefValue = "the server's --lease-gc-after"
	return cmd
}

// heldLine is what heartbeat prints once it holds the node lease. The
// interval is TTL/3, shown to the millisecond: a 4s TTL's is 1.333s, not
// 1.333333333s.
func heldLine(lease client.LeaseName, token int64, ttl time.Duration) string {
	return fmt.Sprintf("tenure: %s is held (token %d); heartbeats every %v", lease, token, (ttl / 3).Round(time.Millisecond))
}

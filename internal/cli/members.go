package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewMembersCommand builds `tenure members`.
func NewMembersCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List the cluster's servers",
		Long: `List the servers of the raft configuration as the endpoint in use sees them:
ID, peer address, whether it votes, which one leads, and which one answered.`,
		Example: `  tenure members
  tenure members -o yaml --endpoints 10.0.0.5:7480`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				members, err := c.Members(ctx)
				if err != nil {
					return unreachable(err)
				}
				return printMembers(cmd.OutOrStdout(), members, g.output)
			})
		},
	}
	addOutputFlags(cmd, g, "table, json or yaml")
	return cmd
}

type memberDoc struct {
	ID          string `json:"id"`
	PeerAddress string `json:"peerAddress"`
	Voter       bool   `json:"voter"`
	Leader      bool   `json:"leader"`
	Self        bool   `json:"self"`
}

func printMembers(w io.Writer, members []client.Member, format string) error {
	switch format {
	case "json", "yaml":
		items := make([]memberDoc, 0, len(members))
		for _, m := range members {
			items = append(items, memberDoc(m))
		}
		return printDoc(w, format, listDoc{APIVersion: "v1", Kind: "List", Items: items})
	case "", "table", "wide":
	default:
		return usage("-o %q: use table, json or yaml", format)
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "ID\tPEER-ADDRESS\tROLE\tSUFFRAGE")
	for _, m := range members {
		role := "follower"
		if m.Leader {
			role = "leader"
		}
		if m.Self {
			role += " (answered)"
		}
		suffrage := "voter"
		if !m.Voter {
			suffrage = "nonvoter"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.ID, m.PeerAddress, role, suffrage)
	}
	return tw.Flush()
}

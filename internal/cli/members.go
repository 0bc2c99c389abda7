package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewMembersCommand builds `tenure members` and its subcommands.
func NewMembersCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List the cluster's servers, remove one, or move leadership",
		Long: `List the servers of the raft configuration as the endpoint in use sees them,
each with the status it reports about itself: its ID, API and peer addresses,
its role (the leader is marked "leader"; a member that did not answer within
a second is "unreachable"), and whether it votes. -o wide adds each member's
raft term, commit and applied indexes, and how long ago it last heard from the
leader; -o json and -o yaml print every field, with the reason a member is
unreachable.`,
		Example: `  tenure members
  tenure members -o wide --endpoints 10.0.0.5:7480
  tenure members remove 10.0.0.7:7481
  tenure members transfer-leadership`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch g.output {
			case "", "table", "wide", "json", "yaml":
			default:
				return usage("-o %q: use table, wide, json or yaml", g.output)
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				members, err := c.Members(ctx)
				if err != nil {
					return unreachable(err)
				}
				return printMembers(cmd.OutOrStdout(), members, g.output)
			})
		},
	}
	addOutputFlags(cmd, g, "table, wide, json or yaml")
	cmd.AddCommand(newMembersRemoveCommand(g), newTransferLeadershipCommand(g))
	return cmd
}

func newMembersRemoveCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID",
		Short: "Take a server out of the cluster",
		Long: `Take the server ID (as tenure members lists it) out of the raft
configuration, through the leader. Removing the leader makes the others
elect a new one. Stop the removed node's process afterwards; to bring it
back, start it on an empty --data-dir with --join.

Remove a dead member before replacing it, so that it stops counting
towards the quorum: a 3-voter cluster with one dead member has no room
for another failure.`,
		Example: `  tenure members remove 10.0.0.7:7481`,
		Args:    exactArgs("remove takes the ID of one member (tenure members lists them)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if strings.TrimSpace(id) == "" {
				return usage("member ID is empty: tenure members lists them")
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.RemoveMember(ctx, id); err != nil {
					return unreachable(err)
				}
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "removed member %s\n", id)
				return err
			})
		},
	}
}

func newTransferLeadershipCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "transfer-leadership [ID]",
		Short: "Hand leadership to another voter",
		Long: `Hand leadership to the voter ID, or without ID to the most up-to-date
other voter, and print the new leader once it leads: e.g. before taking the
leader's host down for maintenance. Clients follow the new leader by
themselves; calls in flight during the handover are retried.`,
		Example: `  tenure members transfer-leadership
  tenure members transfer-leadership 10.0.0.6:7481`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usage("transfer-leadership takes at most one member ID, got %d", len(args))
			}
			if len(args) == 1 && strings.TrimSpace(args[0]) == "" {
				return usage("member ID is empty: leave it out to let the cluster pick the new leader")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var id string
			if len(args) == 1 {
				id = args[0]
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				leader, err := c.TransferLeadership(ctx, id)
				if err != nil {
					return unreachable(err)
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "leader is now %s\n", leader)
				return err
			})
		},
	}
}

// exactArgs wants one argument, and says what it is when it is missing.
func exactArgs(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usage("%s, got %d arguments", what, len(args))
		}
		return nil
	}
}

// memberDoc is a member for -o json and -o yaml: every field the client
// has, the status only when the member answered.
type memberDoc struct {
	ID          string           `json:"id"`
	APIAddress  string           `json:"apiAddress"`
	PeerAddress string           `json:"peerAddress"`
	Voter       bool             `json:"voter"`
	Leader      bool             `json:"leader"`
	Self        bool             `json:"self"`
	Status      *memberStatusDoc `json:"status,omitempty"`
	Error       string           `json:"error,omitempty"`
}

type memberStatusDoc struct {
	Role             string `json:"role"`
	LeaderID         string `json:"leaderID"`
	LeaderAPIAddress string `json:"leaderAPIAddress"`
	Term             uint64 `json:"term"`
	CommitIndex      uint64 `json:"commitIndex"`
	AppliedIndex     uint64 `json:"appliedIndex"`
	LastLogIndex     uint64 `json:"lastLogIndex"`
	LastContact      string `json:"lastContact"`
	Revision         int64  `json:"revision"`
	Ready            bool   `json:"ready"`
	Version          int    `json:"version,omitempty"`
	ClusterVersion   int    `json:"clusterVersion,omitempty"`
}

func toMemberDoc(m client.Member) memberDoc {
	d := memberDoc{ID: m.ID, APIAddress: m.APIAddress, PeerAddress: m.PeerAddress, Voter: m.Voter, Leader: m.Leader, Self: m.Self, Error: m.Err}
	if m.Reachable() {
		d.Status = &memberStatusDoc{
			Role: m.Role, LeaderID: m.LeaderID, LeaderAPIAddress: m.LeaderAPIAddress,
			Term: m.Term, CommitIndex: m.CommitIndex, AppliedIndex: m.AppliedIndex, LastLogIndex: m.LastLogIndex,
			LastContact: m.LastContact.String(), Revision: m.Revision, Ready: m.Ready,
			Version: m.Version, ClusterVersion: m.ClusterVersion,
		}
	}
	return d
}

// memberRole is the ROLE column: what the member says it is, "leader"
// for the leader whatever it says, and "unreachable" when it said nothing.
// The answering node is marked, since the list is its view.
func memberRole(m client.Member) string {
	var role string
	switch {
	case !m.Reachable() && m.Leader:
		role = "leader, unreachable"
	case !m.Reachable():
		role = "unreachable"
	case m.Leader || m.Role == "leader":
		role = "leader"
	case m.Role != "":
		role = m.Role
	default:
		role = "follower"
	}
	if m.Self {
		role += " (answered)"
	}
	return role
}

// memberVersion is the VERSION column: the cluster version the member's
// build runs and, when the cluster runs a lower one (an upgrade under
// way), that one too.
func memberVersion(m client.Member) string {
	switch {
	case m.Version == 0:
		return "1" // a build from before versions
	case m.ClusterVersion != 0 && m.ClusterVersion < m.Version:
		return fmt.Sprintf("%d (cluster %d)", m.Version, m.ClusterVersion)
	}
	return strconv.Itoa(m.Version)
}

func printMembers(w io.Writer, members []client.Member, format string) error {
	switch format {
	case "json", "yaml":
		items := make([]memberDoc, 0, len(members))
		for _, m := range members {
			items = append(items, toMemberDoc(m))
		}
		return printDoc(w, format, listDoc{APIVersion: "v1", Kind: "List", Items: items})
	case "", "table", "wide":
	default:
		return usage("-o %q: use table, wide, json or yaml", format)
	}
	wide := format == "wide"
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	header := "ID\tAPI-ADDRESS\tPEER-ADDRESS\tROLE\tVOTER"
	if wide {
		header += "\tTERM\tCOMMIT\tAPPLIED\tLAST-CONTACT\tVERSION"
	}
	fmt.Fprintln(tw, header)
	for _, m := range members {
		api := m.APIAddress
		if api == "" {
			api = "<none>"
		}
		voter := "no"
		if m.Voter {
			voter = "yes"
		}
		row := []string{m.ID, api, m.PeerAddress, memberRole(m), voter}
		if wide {
			if m.Reachable() {
				contact := "<none>" // the leader hears from nobody
				if m.LastContact > 0 {
					contact = m.LastContact.Round(time.Millisecond).String() + " ago"
				}
				row = append(row, strconv.FormatUint(m.Term, 10), strconv.FormatUint(m.CommitIndex, 10),
					strconv.FormatUint(m.AppliedIndex, 10), contact, memberVersion(m))
			} else {
				row = append(row, "<unknown>", "<unknown>", "<unknown>", "<unknown>", "<unknown>")
			}
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

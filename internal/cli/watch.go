package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewWatchCommand builds `tenure watch`.
func NewWatchCommand(g *globals) *cobra.Command {
	var from int64
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Print lease events as they happen",
		Long: `Print lease events — acquired, released, expired, revoked, waiting,
wait-ended, value-set, lock-delay-ended — in revision order as they happen,
for one namespace or all (-A), until interrupted. --rev replays from a past
revision while the server still has it. -o json prints one JSON object per
line.`,
		Example: `  tenure watch -A
  tenure watch -n prod --rev 1 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				out := cmd.OutOrStdout()
				for ev := range c.WatchLeases(ctx, listOptions(g, ""), from) {
					if ev.Err != nil {
						return unreachable(ev.Err)
					}
					if err := printLeaseEvent(out, ev, g.output); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	addOutputFlags(cmd, g, "table (default) or json")
	addAllNamespacesFlag(cmd, g)
	cmd.Flags().Int64Var(&from, "rev", 0, "start at this revision (default: now)")
	return cmd
}

type leaseEventDoc struct {
	Revision  int64  `json:"revision"`
	Time      string `json:"time"`
	Type      string `json:"type"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Holder    string `json:"holder,omitempty"`
	SessionID int64  `json:"sessionID,omitempty"`
	Token     int64  `json:"token,omitempty"`
	Value     string `json:"value,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

func printLeaseEvent(w io.Writer, ev client.LeaseEvent, format string) error {
	if format == "json" {
		b, err := json.Marshal(leaseEventDoc{
			Revision: ev.Revision, Time: ev.Time.UTC().Format(time.RFC3339Nano), Type: ev.Type,
			Namespace: ev.Namespace, Name: ev.Name, Holder: ev.Holder, SessionID: ev.SessionID,
			Token: ev.Token, Value: ev.Value, Reason: ev.Reason,
		})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	line := fmt.Sprintf("%s  %-16s %s", ev.Time.UTC().Format("2006-01-02T15:04:05.000Z"), ev.Type, client.LeaseName{Namespace: ev.Namespace, Name: ev.Name})
	if ev.Holder != "" {
		line += " holder=" + ev.Holder
	}
	if ev.Token != 0 {
		line += fmt.Sprintf(" token=%d", ev.Token)
	}
	if ev.Value != "" {
		line += fmt.Sprintf(" value=%q", ev.Value)
	}
	if ev.Reason != "" {
		line += fmt.Sprintf(" reason=%q", ev.Reason)
	}
	_, err := fmt.Fprintf(w, "%s revision=%d\n", line, ev.Revision)
	return err
}

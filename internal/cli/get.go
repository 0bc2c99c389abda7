package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/client"
)

// NewGetCommand builds `tenure get`.
func NewGetCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get",
		Short: "List leases or sessions, kubectl-style",
		Example: `  tenure get leases -A -o wide
  tenure get sessions`,
		// A mistyped subcommand is a usage error (exit 2), not help and exit 0.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	var selector string
	var stale, live bool
	leases := &cobra.Command{
		Use:     "leases [NAME]",
		Aliases: []string{"lease"},
		Short:   "List leases, or show one",
		Long: `List leases: NAMESPACE (with -A), NAME, HOLDER, STATUS and AGE (how long the
current holder has held it). STATUS is Held (with how many wait), Waiting
(waiters, no holder: a lock-delay), or how and how long ago the last grant
ended: Released, Expired or Revoked 2m ago — a record outlives its holder
until its gc_after. --live keeps only held leases. -o wide adds TOKEN, TTL,
EXPIRES-IN, WAITERS, TRANSITIONS and VALUE; -o json and -o yaml print
Kubernetes-Lease-shaped documents with Tenure's status (fencing token,
holders, waiters, the last grant, the preferred holder).

An etcd lock or a Kubernetes Lease is shown by the namespace the list
gives it: -n '(etcd)' with the lock's name, -n '(kubernetes)/NAMESPACE'
with the Lease's.`,
		Example: `  tenure get leases -A
  tenure get leases -n prod -l app=scheduler -o wide
  tenure get leases -n node-lease
  tenure get leases -n identity -l app=api --live
  tenure get lease nightly-report -o yaml
  tenure get lease -n '(etcd)' jobs/nightly -o wide
  tenure get lease -n '(kubernetes)/kube-system' kube-scheduler`,
		Args: cobra.MatchAll(cobra.MaximumNArgs(1), leaseNameArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if len(args) == 1 && derivedNamespace(g.namespace) {
					l, err := derivedLease(ctx, c, g.namespace, args[0], readOptions(stale))
					if err != nil {
						return err
					}
					if g.output == "json" || g.output == "yaml" {
						return printDoc(cmd.OutOrStdout(), g.output, toLeaseDoc(l))
					}
					return printLeases(cmd.OutOrStdout(), []client.Lease{l}, g.output, true, time.Now())
				}
				if len(args) == 1 {
					l, err := c.Lease(ctx, g.namespace, args[0], readOptions(stale)...)
					if err != nil {
						return unreachable(err)
					}
					if g.output == "json" || g.output == "yaml" {
						return printDoc(cmd.OutOrStdout(), g.output, toLeaseDoc(l))
					}
					return printLeases(cmd.OutOrStdout(), []client.Lease{l}, g.output, false, time.Now())
				}
				list, err := c.Leases(ctx, listOptions(g, selector), readOptions(stale)...)
				if err != nil {
					return unreachable(err)
				}
				if live {
					list = slices.DeleteFunc(list, func(l client.Lease) bool { return len(l.Holders) == 0 })
				}
				return printLeases(cmd.OutOrStdout(), list, g.output, g.allNamespaces, time.Now())
			})
		},
	}
	addOutputFlags(leases, g, "table, wide, json or yaml")
	addAllNamespacesFlag(leases, g)
	leases.Flags().StringVarP(&selector, "selector", "l", "", "label selector, e.g. app=web,tier!=db")
	leases.Flags().BoolVar(&live, "live", false, "only leases held now: the live set of identity leases or node heartbeats")
	addStaleFlag(leases, &stale)

	sessions := &cobra.Command{
		Use:     "sessions",
		Aliases: []string{"session"},
		Short:   "List open sessions",
		Example: `  tenure get sessions
  tenure get sessions -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				list, err := c.Sessions(ctx, selector, readOptions(stale)...)
				if err != nil {
					return unreachable(err)
				}
				return printSessions(cmd.OutOrStdout(), list, g.output, time.Now())
			})
		},
	}
	addOutputFlags(sessions, g, "table, json or yaml")
	sessions.Flags().StringVarP(&selector, "selector", "l", "", "label selector")
	addStaleFlag(sessions, &stale)
	cmd.AddCommand(leases, sessions)
	return cmd
}

func listOptions(g *globals, selector string) client.ListOptions {
	return client.ListOptions{Namespace: g.namespace, AllNamespaces: g.allNamespaces, LabelSelector: selector}
}

// derivedNamespace reports whether ns is one the list derives from keys
// rather than a Tenure namespace: "(etcd)" for etcd's locks and
// elections, "(kubernetes)/NAMESPACE" for Kubernetes Leases (namespaceText).
func derivedNamespace(ns string) bool {
	return ns == "(etcd)" || strings.HasPrefix(ns, "(kubernetes)/")
}

// derivedLease finds the etcd lock or Kubernetes Lease shown as ns and
// name in `tenure get lease -A`: the server serves those in its list
// across all namespaces only, to callers who may read their keys.
func derivedLease(ctx context.Context, c *client.Client, ns, name string, opts []client.ReadOption) (client.Lease, error) {
	list, err := c.Leases(ctx, client.ListOptions{AllNamespaces: true}, opts...)
	if err != nil {
		return client.Lease{}, unreachable(err)
	}
	for _, l := range list {
		if namespaceText(l) == ns && l.Name == name {
			return l, nil
		}
	}
	return client.Lease{}, fmt.Errorf("%w: no lease %s in %s (it is listed only while its keys exist, and only to callers that may read them)", client.ErrNotFound, name, ns)
}

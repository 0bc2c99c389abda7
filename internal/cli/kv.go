package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/client"
)

// ttlFlag accepts seconds ("10", as etcdctl does) or a Go duration
// ("10s", "1m30s").
type ttlFlag struct{ d time.Duration }

func (f *ttlFlag) String() string {
	if f.d == 0 {
		return ""
	}
	return f.d.String()
}

func (f *ttlFlag) Set(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n <= 0 {
			return fmt.Errorf("TTL %q must be positive", s)
		}
		f.d = time.Duration(n) * time.Second
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("TTL %q: give seconds (10) or a duration (10s)", s)
	}
	f.d = d
	return nil
}

func (f *ttlFlag) Type() string { return "seconds" }

func (f *ttlFlag) opts() []client.WriteOption {
	if f.d == 0 {
		return nil
	}
	return []client.WriteOption{client.WithKeyTTL(f.d)}
}

// NewKVCommand builds `tenure kv`.
func NewKVCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Keys: get, range, put, del, mk, set (compare-and-swap), watch",
		Long: `The key/value layer, etcdctl-style. Keys have a global revision, per-key
versions, TTLs and compare-and-swap, enough to build a lock by hand as in the
classic etcdctl walkthrough:

  tenure kv set my-lock unlocked
  tenure kv set my-lock alice --swap-with-value unlocked     # alice takes it
  tenure kv set my-lock bob --swap-with-value unlocked       # bob fails, exit 1
  tenure kv set my-lock unlocked --swap-with-value alice     # alice unlocks

or with a TTL, renewed by the holder:

  tenure kv mk my-lock alice --ttl 10
  tenure kv set my-lock alice --ttl 10 --swap-with-value alice

A failed compare prints "Error: compare failed ([expected != actual]) [revision]"
to stderr and exits 1.`,
		Example: `  tenure kv put config/feature on
  tenure kv get config/feature
  tenure kv set my-lock alice --swap-with-value unlocked
  tenure kv watch --prefix config/`,
		// A mistyped subcommand is a usage error (exit 2), not help and exit 0.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(kvGet(g), kvRange(g), kvPut(g), kvDel(g), kvMk(g), kvSet(g), kvWatch(g))
	return cmd
}

func kvGet(g *globals) *cobra.Command {
	var stale bool
	cmd := &cobra.Command{
		Use:     "get KEY",
		Short:   "Print a key's value, its bytes exactly (exit 1 if absent)",
		Example: `  tenure kv get my-lock`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				kv, err := c.KV().Get(ctx, args[0], readOptions(stale)...)
				if errors.Is(err, client.ErrNotFound) {
					return unmet(fmt.Errorf("key not found (%s)", args[0]))
				}
				if err != nil {
					return unreachable(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), kv.Value)
				return nil
			})
		},
	}
	addStaleFlag(cmd, &stale)
	return cmd
}

// addStaleFlag adds --stale to a command that reads.
func addStaleFlag(cmd *cobra.Command, stale *bool) {
	cmd.Flags().BoolVar(stale, "stale", false, "answer from the node called, which may trail the leader by a moment, instead of a linearizable read through the leader")
}

func readOptions(stale bool) []client.ReadOption {
	if stale {
		return []client.ReadOption{client.Stale()}
	}
	return nil
}

func kvRange(g *globals) *cobra.Command {
	var limit int64
	var stale bool
	cmd := &cobra.Command{
		Use:     "range PREFIX",
		Short:   "Print every key with a prefix and its value, a line each (bytes that are not UTF-8 as \\xNN)",
		Example: `  tenure kv range jobs/`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				kvs, _, _, err := c.KV().Range(ctx, args[0], limit, readOptions(stale)...)
				if err != nil {
					return unreachable(err)
				}
				for _, kv := range kvs {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\n%s\n", api.EscapeNonUTF8(kv.Key), api.EscapeNonUTF8(kv.Value))
				}
				return nil
			})
		},
	}
	cmd.Flags().Int64Var(&limit, "limit", 0, "at most this many keys (0: all)")
	addStaleFlag(cmd, &stale)
	return cmd
}

func kvPut(g *globals) *cobra.Command {
	var ttl ttlFlag
	cmd := &cobra.Command{
		Use:     "put KEY VALUE",
		Short:   "Write a key",
		Example: `  tenure kv put config/feature on --ttl 60`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if _, err := c.KV().Put(ctx, args[0], args[1], ttl.opts()...); err != nil {
					return unreachable(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), "OK")
				return nil
			})
		},
	}
	cmd.Flags().Var(&ttl, "ttl", "expire the key after this many seconds unless written again")
	return cmd
}

func kvDel(g *globals) *cobra.Command {
	var prefix bool
	cmd := &cobra.Command{
		Use:   "del KEY",
		Short: "Delete a key (or every key with a prefix) and print how many went",
		Example: `  tenure kv del my-lock
  tenure kv del --prefix jobs/`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				var (
					n   int64
					err error
				)
				if prefix {
					n, err = c.KV().DeletePrefix(ctx, args[0])
				} else {
					n, err = c.KV().Delete(ctx, args[0])
				}
				if err != nil {
					return unreachable(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), n)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&prefix, "prefix", false, "delete every key with KEY as prefix")
	return cmd
}

func kvMk(g *globals) *cobra.Command {
	var ttl ttlFlag
	cmd := &cobra.Command{
		Use:     "mk KEY VALUE",
		Short:   "Create a key; fail (exit 1) if it exists",
		Example: `  tenure kv mk my-lock alice --ttl 10`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				_, err := c.KV().CompareAndSwap(ctx, args[0], client.Absent(), args[1], ttl.opts()...)
				var cf *client.CompareFailedError
				if errors.As(err, &cf) {
					return unmet(fmt.Errorf("key already exists (%s) [%d]", args[0], cf.Revision))
				}
				if err != nil {
					return unreachable(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), args[1])
				return nil
			})
		},
	}
	cmd.Flags().Var(&ttl, "ttl", "expire the key after this many seconds unless written again")
	return cmd
}

func kvSet(g *globals) *cobra.Command {
	var (
		ttl       ttlFlag
		swapValue string
		swapRev   int64
	)
	cmd := &cobra.Command{
		Use:   "set KEY VALUE",
		Short: "Write a key, optionally only if it holds a value or revision",
		Example: `  tenure kv set my-lock alice --swap-with-value unlocked
  tenure kv set my-lock alice --ttl 10 --swap-with-value alice
  tenure kv set config v2 --swap-with-revision 41`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, value := args[0], args[1]
			byValue, byRev := cmd.Flags().Changed("swap-with-value"), cmd.Flags().Changed("swap-with-revision")
			if byRev && swapRev < 0 {
				return usage("--swap-with-revision %d must not be negative", swapRev)
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				kv := c.KV()
				var err error
				switch {
				case byValue:
					_, err = kv.CompareAndSwap(ctx, key, client.ValueIs(swapValue), value, ttl.opts()...)
				case byRev:
					_, err = kv.CompareAndSwap(ctx, key, client.ModRevisionIs(swapRev), value, ttl.opts()...)
				default:
					_, err = kv.Put(ctx, key, value, ttl.opts()...)
				}
				var cf *client.CompareFailedError
				if errors.As(err, &cf) {
					return unmet(compareFailed(key, cf, byValue, swapValue, swapRev))
				}
				if err != nil {
					return unreachable(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), value)
				return nil
			})
		},
	}
	cmd.Flags().Var(&ttl, "ttl", "expire the key after this many seconds unless written again")
	cmd.Flags().StringVar(&swapValue, "swap-with-value", "", "write only if the key's value is this")
	cmd.Flags().Int64Var(&swapRev, "swap-with-revision", 0, "write only if the key was last written at this revision")
	cmd.MarkFlagsMutuallyExclusive("swap-with-value", "swap-with-revision")
	return cmd
}

// compareFailed phrases a failed swap as etcdctl does:
// compare failed ([expected != actual]) [revision].
func compareFailed(key string, cf *client.CompareFailedError, byValue bool, want string, wantRev int64) error {
	if !cf.Found && (byValue || wantRev != 0) {
		return fmt.Errorf("key not found (%s) [%d]", key, cf.Revision)
	}
	if byValue {
		return fmt.Errorf("compare failed ([%s != %s]) [%d]", want, cf.Current.Value, cf.Revision)
	}
	return fmt.Errorf("compare failed ([%d != %d]) [%d]", wantRev, cf.Current.ModRevision, cf.Revision)
}

func kvWatch(g *globals) *cobra.Command {
	var (
		prefix string
		rev    int64
	)
	cmd := &cobra.Command{
		Use:   "watch [KEY | --prefix PREFIX]",
		Short: "Print changes to a key or prefix as they happen",
		Long: `Print every change to KEY (or to keys under --prefix) in revision order until
interrupted, as three lines per event: PUT, DELETE or EXPIRE; the key; the
value. --rev replays from a past revision while the server still has it.`,
		Example: `  tenure kv watch my-lock
  tenure kv watch --prefix jobs/ --rev 1`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == (prefix != "") {
				return usage("give either KEY or --prefix PREFIX")
			}
			key, opts := prefix, []client.WatchOption{client.WithPrefix()}
			if len(args) == 1 {
				key, opts = args[0], nil
			}
			if rev > 0 {
				opts = append(opts, client.WithRevision(rev))
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				for ev := range c.KV().Watch(ctx, key, opts...) {
					if ev.Err != nil {
						return unreachable(ev.Err)
					}
					printKeyEvent(cmd.OutOrStdout(), ev)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "watch every key with this prefix")
	cmd.Flags().Int64Var(&rev, "rev", 0, "start at this revision (default: now)")
	return cmd
}

func printKeyEvent(w io.Writer, ev client.WatchEvent) {
	fmt.Fprintf(w, "%s\n%s\n%s\n", ev.Type, api.EscapeNonUTF8(ev.KV.Key), api.EscapeNonUTF8(ev.KV.Value))
}

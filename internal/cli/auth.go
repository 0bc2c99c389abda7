package cli

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/auth"
)

// NewAuthCommand builds `tenure auth`.
func NewAuthCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Make bearer tokens and check policy files",
		Example: `  # A token for the scheduler, and the line for the policy file
  tenure auth token scheduler

  # Is the policy file valid? (serve would refuse it, and a running
  # server would keep its old policy)
  tenure auth check policy.yaml`,
	}
	token := &cobra.Command{
		Use:   "token PRINCIPAL",
		Short: "Make a random bearer token for PRINCIPAL, and print it and its hash for the policy",
		Long: `Print a new random token (32 bytes from the system's CSPRNG) on the first
line, for its holder only (TENURE_TOKEN=... or client.WithToken), and on the
next lines the policy entry that stores its SHA-256. The policy file holds
only the hash; the token itself is the holder's secret, sent with each call.`,
		Example: `  tenure auth token scheduler
  # give the first line to the scheduler (TENURE_TOKEN), put the rest under
  # principals: in the policy file`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t := auth.NewToken()
			fmt.Fprintln(cmd.OutOrStdout(), t)
			fmt.Fprintf(cmd.OutOrStdout(), "# for the policy file, under principals (name the roles it gets):\n  - name: %s\n    roles: []\n    tokens:\n      - sha256: %q\n", args[0], auth.HashToken(t))
			return nil
		},
	}
	hash := &cobra.Command{
		Use:   "hash",
		Short: "Print the policy hash of a token read from standard input",
		Example: `  # the hash of a token you already have, for the policy file
  printenv TENURE_TOKEN | tenure auth hash`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
			line = strings.TrimSpace(line)
			if line == "" {
				return usage("no token on standard input: %v", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), auth.HashToken(line))
			return nil
		},
	}
	check := &cobra.Command{
		Use:     "check FILE",
		Short:   "Check a policy file as serve would",
		Example: `  tenure auth check /etc/tenure/policy.yaml && kill -HUP $(pidof tenure)`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return usage("%v", err)
			}
			if _, err := auth.Parse(data); err != nil {
				return usage("%s: %v", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(token, hash, check)
	return cmd
}

package cli

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/internal/certs"
)

// NewCertsCommand builds `tenure certs`.
func NewCertsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Make throwaway TLS certificates for trying TLS on one machine",
		Example: `  # A CA, server, peer and client certificates for localhost in ./certs
  tenure certs init ./certs`,
	}
	var o certs.Options
	initCmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Write development CAs and the server, peer and client certificates they sign into DIR",
		Long: `Write a development CA (ca.pem) and, signed by it, a server certificate for
the API and a peer certificate for raft traffic, for localhost, 127.0.0.1
and ::1 unless --hosts says otherwise; and a client CA (client-ca.pem) and,
signed by it, a client certificate named by --client-name. Clients get their
own CA because with a policy (--policy) a certificate from the peer CA
speaks for the cluster's nodes. Keys are written
unencrypted; use your own CA in production. Existing files are never
overwritten.`,
		Example: `  tenure certs init ./certs
  tenure serve --cert-file certs/server.pem --key-file certs/server-key.pem --client-ca-file certs/client-ca.pem
  tenure --cacert certs/ca.pem --cert certs/client.pem --key certs/client-key.pem get leases`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := certs.Init(dir, o); err != nil {
				return usage("%v", err)
			}
			for _, f := range certs.Files {
				fmt.Fprintln(cmd.OutOrStdout(), filepath.Join(dir, f))
			}
			return nil
		},
	}
	initCmd.Flags().StringSliceVar(&o.Hosts, "hosts", nil, "DNS names and IPs the server and peer certificates are valid for (default localhost,127.0.0.1,::1)")
	initCmd.Flags().StringVar(&o.ClientName, "client-name", "admin", "the client certificate's subject CN")
	var co certs.Options
	clientCmd := &cobra.Command{
		Use:   "client DIR NAME",
		Short: "Sign a client certificate for principal NAME with the client CA in DIR",
		Long: `Sign, with the client CA that tenure certs init wrote into DIR, a client
certificate whose subject CN is NAME: the principal a policy knows it as.
Writes DIR/NAME.pem and DIR/NAME-key.pem; existing files are never
overwritten.`,
		Example: `  tenure certs client ./certs team-a
  tenure --cacert certs/ca.pem --cert certs/team-a.pem --key certs/team-a-key.pem lock -n team-a job -- ./job.sh`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, name := args[0], args[1]
			if err := certs.Client(dir, name, name, co); err != nil {
				return usage("%v", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), filepath.Join(dir, name+".pem"))
			fmt.Fprintln(cmd.OutOrStdout(), filepath.Join(dir, name+"-key.pem"))
			return nil
		},
	}
	clientCmd.Flags().DurationVar(&co.Validity, "validity", 0, "how long the certificate is valid (default a year)")
	cmd.AddCommand(initCmd, clientCmd)
	return cmd
}

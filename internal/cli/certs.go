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
		Short: "Write a CA and the server, peer and client certificates it signs into DIR",
		Long: `Write a development CA and, signed by it, a server certificate for the API,
a peer certificate for raft traffic and a client certificate, for localhost,
127.0.0.1 and ::1 unless --hosts says otherwise. Keys are written
unencrypted; use your own CA in production. Existing files are never
overwritten.`,
		Example: `  tenure certs init ./certs
  tenure serve --cert-file certs/server.pem --key-file certs/server-key.pem --client-ca-file certs/ca.pem
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
	cmd.AddCommand(initCmd)
	return cmd
}

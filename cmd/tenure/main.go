// Command tenure is Tenure's server and command-line client.
package main

import (
	"os"

	"github.com/tenurehq/tenure/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

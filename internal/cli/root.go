// Package cli holds the tenure command tree. main only hands off to Main,
// so end-to-end tests drive the same code the binary runs.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes, documented in docs/cli.md.
const (
	ExitOK          = 0
	ExitUnmet       = 1 // a condition was not met: compare failed, lock held, token invalid
	ExitUsage       = 2
	ExitUnreachable = 3
)

// exitError carries an exit code out of a command's RunE.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// Main runs the tenure command line and returns the process exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := NewRootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintln(stderr, "Error:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return ExitUsage
}

// NewRootCommand builds the whole command tree.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "tenure",
		Short:         "Distributed locks, leases, semaphores and leader election with fencing tokens",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(NewServeCommand())
	return root
}

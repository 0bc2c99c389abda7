package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tenurehq/tenure/statemachine"
)

// Set with -ldflags -X by builds that have no git metadata to stamp,
// such as `docker build`, whose context leaves .git out
// (scripts/build.sh passes them when TENURE_VERSION, TENURE_COMMIT or
// TENURE_COMMIT_TIME are set). Each wins over what the Go toolchain
// stamped, since it was asked for explicitly.
var (
	buildVersion    string
	buildCommit     string
	buildCommitTime string
)

// buildInfo is what `tenure version` reports about the running binary.
type buildInfo struct {
	Version    string `json:"version"`
	Commit     string `json:"commit,omitempty"`
	CommitTime string `json:"commitTime,omitempty"`
	// Dirty is true when the build's work tree had changes not in Commit.
	Dirty     bool   `json:"dirty"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"` // GOOS/GOARCH
	// ClusterVersion is the highest cluster version this build runs
	// (the VERSION column of `tenure members -o wide`).
	ClusterVersion int `json:"clusterVersion"`
}

// readBuildInfo describes this binary from what the Go toolchain stamped
// into it (the main module's version and the vcs.* settings) and the
// -X overrides above.
func readBuildInfo() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return describeBuild(bi, buildVersion, buildCommit, buildCommitTime)
}

// describeBuild is readBuildInfo on given inputs, so that tests can give
// it builds of every kind. bi may be nil: a binary built without module
// support.
func describeBuild(bi *debug.BuildInfo, version, commit, commitTime string) buildInfo {
	out := buildInfo{
		Version:        "(devel)",
		GoVersion:      runtime.Version(),
		Platform:       runtime.GOOS + "/" + runtime.GOARCH,
		ClusterVersion: statemachine.Version,
	}
	if bi != nil {
		if v := bi.Main.Version; v != "" {
			out.Version = v
		}
		if bi.GoVersion != "" {
			out.GoVersion = bi.GoVersion
		}
		var goos, goarch string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				out.Commit = s.Value
			case "vcs.time":
				out.CommitTime = s.Value
			case "vcs.modified":
				out.Dirty = s.Value == "true"
			case "GOOS":
				goos = s.Value
			case "GOARCH":
				goarch = s.Value
			}
		}
		if goos != "" && goarch != "" {
			out.Platform = goos + "/" + goarch
		}
	}
	if version != "" {
		out.Version = version
	}
	if commit != "" {
		// A commit given by hand says nothing of the tree it was
		// built from; a "-dirty" suffix, as git describe writes it,
		// does.
		c, dirty := strings.CutSuffix(commit, "-dirty")
		if c != out.Commit {
			out.CommitTime = "" // the stamped time was another commit's
		}
		out.Commit, out.Dirty = c, dirty
	}
	if commitTime != "" {
		out.CommitTime = commitTime
	}
	return out
}

// String is the text form: the version on the first line, as
// `tenure --version` prints it too.
func (b buildInfo) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "tenure %s\n", b.Version)
	commit := b.Commit
	if commit == "" {
		commit = "unknown (built without git metadata)"
	}
	if b.Dirty {
		commit += " (dirty: built with uncommitted changes)"
	}
	fmt.Fprintf(&s, "commit:          %s\n", commit)
	if b.CommitTime != "" {
		fmt.Fprintf(&s, "commit time:     %s\n", b.CommitTime)
	}
	fmt.Fprintf(&s, "go:              %s\n", b.GoVersion)
	fmt.Fprintf(&s, "platform:        %s\n", b.Platform)
	fmt.Fprintf(&s, "cluster version: %d\n", b.ClusterVersion)
	return s.String()
}

// NewVersionCommand builds `tenure version`.
func NewVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version this binary was built with",
		Long: `Print what this binary was built from: its version (the module version, or
a pseudo-version from git), the commit and its time, whether the work tree
had uncommitted changes (dirty), the Go version, the platform (GOOS/GOARCH)
and the highest cluster version it runs (see docs/operations.md, Upgrade one
node at a time). Nothing is sent to a server.`,
		Example: `  tenure version
  tenure version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return printVersion(cmd.OutOrStdout(), readBuildInfo(), output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: text, json or yaml")
	return cmd
}

func printVersion(w io.Writer, b buildInfo, format string) error {
	switch format {
	case "", "text":
		_, err := io.WriteString(w, b.String())
		return err
	case "json", "yaml":
		return printDoc(w, format, b)
	}
	return usage("-o %q: use text, json or yaml", format)
}

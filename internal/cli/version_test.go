package cli

import (
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/tenurehq/tenure/statemachine"
)

func TestDescribeBuild(t *testing.T) {
	stamped := func(modified string) *debug.BuildInfo {
		return &debug.BuildInfo{
			GoVersion: "go1.26.8",
			Main:      debug.Module{Path: "github.com/tenurehq/tenure", Version: "v0.0.0-20261123194941-0c36f3f1dbff"},
			Settings: []debug.BuildSetting{
				{Key: "GOOS", Value: "linux"},
				{Key: "GOARCH", Value: "arm64"},
				{Key: "vcs", Value: "git"},
				{Key: "vcs.revision", Value: "0c36f3f1dbff805ab333a1136c65f60bca4cb03e"},
				{Key: "vcs.time", Value: "2026-11-23T19:49:41Z"},
				{Key: "vcs.modified", Value: modified},
			},
		}
	}
	here := runtime.GOOS + "/" + runtime.GOARCH
	tests := []struct {
		name                        string
		bi                          *debug.BuildInfo
		version, commit, commitTime string // the -X values
		want                        buildInfo
	}{
		{
			name: "a build from a clean checkout reports the module version, the commit, its time and the target platform",
			bi:   stamped("false"),
			want: buildInfo{Version: "v0.0.0-20261123194941-0c36f3f1dbff", Commit: "0c36f3f1dbff805ab333a1136c65f60bca4cb03e",
				CommitTime: "2026-11-23T19:49:41Z", GoVersion: "go1.26.8", Platform: "linux/arm64"},
		},
		{
			name: "a build with uncommitted changes is dirty",
			bi:   stamped("true"),
			want: buildInfo{Version: "v0.0.0-20261123194941-0c36f3f1dbff", Commit: "0c36f3f1dbff805ab333a1136c65f60bca4cb03e",
				CommitTime: "2026-11-23T19:49:41Z", Dirty: true, GoVersion: "go1.26.8", Platform: "linux/arm64"},
		},
		{
			name: "a build without git metadata says (devel) and names no commit",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/tenurehq/tenure", Version: "(devel)"}},
			want: buildInfo{Version: "(devel)", GoVersion: "go1.26.8", Platform: here},
		},
		{
			name:    "values given with -X win, and a -dirty suffix marks the tree dirty",
			bi:      &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			version: "v1.2.0", commit: "0c36f3f1dbff-dirty", commitTime: "2026-11-23T19:49:41Z",
			want: buildInfo{Version: "v1.2.0", Commit: "0c36f3f1dbff", CommitTime: "2026-11-23T19:49:41Z", Dirty: true, GoVersion: "go1.26.8", Platform: here},
		},
		{
			name:   "a commit given with -X drops the time the toolchain stamped for another commit",
			bi:     stamped("false"),
			commit: "1111111111111111111111111111111111111111",
			want: buildInfo{Version: "v0.0.0-20261123194941-0c36f3f1dbff", Commit: "1111111111111111111111111111111111111111",
				GoVersion: "go1.26.8", Platform: "linux/arm64"},
		},
		{
			name: "no build information still names the Go version and the platform",
			want: buildInfo{Version: "(devel)", GoVersion: runtime.Version(), Platform: here},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.want.ClusterVersion = statemachine.Version
			got := describeBuild(tt.bi, tt.version, tt.commit, tt.commitTime)
			if got != tt.want {
				t.Errorf("got = %+v, expected: %+v", got, tt.want)
			}
		})
	}
}

// TestVersionCommand runs `tenure version` as a user would: the test
// binary has no git metadata, but the Go version and platform are this
// process's own.
func TestVersionCommand(t *testing.T) {
	stdout, stderr, code := runMain("version", "-o", "json")
	if code != ExitOK {
		t.Fatalf("version -o json: exit %d, stderr %q", code, stderr)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("version -o json: %v in %q", err, stdout)
	}
	want := map[string]any{"goVersion": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH, "clusterVersion": float64(statemachine.Version)}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("version -o json: %s: got = %v, expected: %v", k, got[k], v)
		}
	}
	for _, k := range []string{"version", "dirty"} {
		if _, ok := got[k]; !ok {
			t.Errorf("version -o json: got = %q, expected: a %q field", stdout, k)
		}
	}

	text, _, code := runMain("version")
	if code != ExitOK || !strings.HasPrefix(text, "tenure ") || !strings.Contains(text, "go:              "+runtime.Version()+"\n") {
		t.Errorf("version: got = exit %d, %q, expected: exit 0, \"tenure VERSION\" first and the Go version", code, text)
	}
	flag, _, code := runMain("--version")
	if code != ExitOK || flag != text {
		t.Errorf("--version: got = exit %d, %q, expected: exit 0 and what version prints, %q", code, flag, text)
	}
	if _, stderr, code := runMain("version", "-o", "xml"); code != ExitUsage || !strings.Contains(stderr, `-o "xml"`) {
		t.Errorf("version -o xml: got = exit %d, %q, expected: exit 2 naming the format", code, stderr)
	}
}

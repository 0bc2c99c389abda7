//go:build linux

package kube

import (
	"os"
	"os/exec"
	"testing"
)

// TestWalkthroughRunsVerbatim runs docs/kubernetes.md's walkthrough by
// its documented command, scripts/kube-walkthrough.sh, which pastes the
// doc's blocks into one shell and checks the lines they promise. It
// needs kube-apiserver and kubectl binaries (the doc's build block makes
// them, in about 6 minutes), so it runs only when $KUBE_APISERVER names
// one ($KUBECTL the other, or /tmp/kubectl); the script itself stops
// the servers it started and gives up after 5 minutes.
func TestWalkthroughRunsVerbatim(t *testing.T) {
	if os.Getenv("KUBE_APISERVER") == "" {
		t.Skip("KUBE_APISERVER is not set: the walkthrough needs a kube-apiserver binary (docs/kubernetes.md, What was run)")
	}
	out, err := exec.Command("../../scripts/kube-walkthrough.sh").CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/kube-walkthrough.sh: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

//go:build linux

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// --- help and completion ---

func TestCLIHelpAndCompletion(t *testing.T) {
	bin := tenureBinary(t)
	run := func(args ...string) result {
		cmd := exec.Command(bin, args...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		return result{out.String(), errOut.String(), cmd.ProcessState.ExitCode()}
	}
	r := run("completion", "bash")
	if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "__start_tenure") {
		t.Errorf("completion bash: got = exit %d, stderr %q, %d bytes, expected: a bash completion script", r.code, r.stderr, len(r.stdout))
	}
	// The script loads in bash and completes the command names.
	if _, err := exec.LookPath("bash"); err == nil {
		script := filepath.Join(t.TempDir(), "tenure.bash")
		if err := os.WriteFile(script, []byte(r.stdout), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("bash", "-c", `source "$1" && complete -p tenure`, "bash", script).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "__start_tenure") {
			t.Errorf("bash: source the completion script: got = %v, %q, expected: complete -p tenure to show it", err, out)
		}
	}
	r = run("__complete", "k")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "kv\t") {
		t.Errorf("__complete k: got = %v, expected: kv", r)
	}

	for _, args := range [][]string{
		{}, {"serve"}, {"lock"}, {"elect"}, {"get"}, {"get", "leases"}, {"get", "sessions"}, {"validate"}, {"revoke"}, {"watch"},
		{"kv"}, {"kv", "get"}, {"kv", "range"}, {"kv", "put"}, {"kv", "del"}, {"kv", "mk"}, {"kv", "set"}, {"kv", "watch"},
	} {
		r := run(append(args, "--help")...)
		if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Examples:\n  ") || !strings.Contains(r.stdout, "Usage:\n  tenure") {
			t.Errorf("tenure %s --help: got = exit %d, stderr %q, expected: exit 0 with usage and examples:\n%s", strings.Join(args, " "), r.code, r.stderr, r.stdout)
		}
	}
	r = run("--help")
	for _, group := range []string{"Run under a lock or leadership:", "Inspect and administer:", "Keys:", "Server:"} {
		if !strings.Contains(r.stdout, group) {
			t.Errorf("tenure --help: got = %q, expected: the group %q", r.stdout, group)
		}
	}
}

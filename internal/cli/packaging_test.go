package cli

// The packaging under deploy/ and the Dockerfile are not run by CI (no
// docker, no systemd, no Kubernetes): these tests read them and check
// what can be checked here. Every `tenure serve` command line in them is
// parsed by the real serve command, every key of the example config is
// applied as serve applies it, and the manifests are decoded strictly
// into the fields packaging_k8s_test.go declares, then checked for what
// a cluster needs.

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

const repoRoot = "../.."

// parseServeArgs parses args (what follows `tenure serve`) with the real
// serve command's flags, as cobra would before running it, and returns
// the command holding the values. Nothing is run.
func parseServeArgs(args []string) (*cobra.Command, error) {
	root := NewRootCommand()
	cmd, rest, err := root.Find(append([]string{"serve"}, args...))
	if err != nil {
		return nil, err
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return nil, err
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return nil, err
	}
	return cmd, nil
}

func flagString(t *testing.T, cmd *cobra.Command, name string) string {
	t.Helper()
	f := cmd.Flags().Lookup(name)
	if f == nil {
		t.Fatalf("serve has no flag --%s", name)
	}
	return f.Value.String()
}

// checkExposed fails when a command line listens beyond loopback without
// TLS and a policy, or without --insecure: serve would refuse to start
// (serveOptions.checkExposure).
func checkExposed(t *testing.T, where string, cmd *cobra.Command) {
	t.Helper()
	if insecure, _ := cmd.Flags().GetBool("insecure"); insecure {
		return
	}
	get := func(name string) string { v, _ := cmd.Flags().GetString(name); return v }
	if !loopback(get("listen")) && (get("cert-file") == "" || get("key-file") == "" || get("policy") == "") {
		t.Errorf("%s: --listen %s is beyond loopback without --cert-file, --key-file and --policy (or --insecure): serve would refuse it", where, get("listen"))
	}
	if !loopback(get("peer-listen")) && (get("peer-cert-file") == "" || get("peer-key-file") == "" || get("peer-ca-file") == "") {
		t.Errorf("%s: --peer-listen %s is beyond loopback without the --peer-*-file flags (or --insecure): serve would refuse it", where, get("peer-listen"))
	}
	if host, _, err := net.SplitHostPort(get("listen")); err == nil && get("advertise") == "" {
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			t.Errorf("%s: --listen %s without --advertise: serve would refuse it", where, get("listen"))
		}
	}
}

// TestSystemdUnit checks deploy/systemd/tenure.service: its ExecStart is a
// valid serve command, the example config it names applies cleanly, the
// config's paths lie in the directories the unit makes writable, and the
// unit keeps its hardening. Where systemd-analyze is installed, it
// verifies the unit as systemd would load it.
func TestSystemdUnit(t *testing.T) {
	path := filepath.Join(repoRoot, "deploy/systemd/tenure.service")
	unit := readUnit(t, path)
	svc := unit["Service"]
	execStart := strings.Fields(first(svc["ExecStart"]))
	if len(execStart) < 2 || !filepath.IsAbs(execStart[0]) || filepath.Base(execStart[0]) != "tenure" || execStart[1] != "serve" {
		t.Fatalf("%s: ExecStart %q: expected: /ABSOLUTE/PATH/tenure serve ...", path, svc["ExecStart"])
	}
	cmd, err := parseServeArgs(execStart[2:])
	if err != nil {
		t.Fatalf("%s: ExecStart: %v", path, err)
	}
	if got := flagString(t, cmd, configFlag); got != "/etc/tenure/tenure.yaml" {
		t.Fatalf("%s: ExecStart --config: got = %q, expected: /etc/tenure/tenure.yaml, where the docs install deploy/systemd/tenure.yaml", path, got)
	}
	// The unit's config is deploy/systemd/tenure.yaml, installed.
	if err := cmd.Flags().Set(configFlag, filepath.Join(repoRoot, "deploy/systemd/tenure.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := applyConfig(cmd, func(string) string { return "" }); err != nil {
		t.Fatalf("deploy/systemd/tenure.yaml: %v", err)
	}
	checkExposed(t, "deploy/systemd/tenure.yaml", cmd)
	inDir := func(flag, dir string) {
		if v := flagString(t, cmd, flag); v != dir && !strings.HasPrefix(v, dir+"/") {
			t.Errorf("deploy/systemd/tenure.yaml: %s %q: expected: in %s, which the unit makes writable (ProtectSystem=strict)", flag, v, dir)
		}
	}
	inDir("data-dir", "/var/lib/"+first(svc["StateDirectory"]))
	if flagString(t, cmd, "audit-log") != "" {
		inDir("audit-log", "/var/log/"+first(svc["LogsDirectory"]))
	}

	want := map[string]string{
		"ExecReload":              "/bin/kill -HUP $MAINPID", // serve re-reads certificates and the policy
		"Restart":                 "on-failure",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"CapabilityBoundingSet":   "",
		"RestrictNamespaces":      "yes",
		"SystemCallArchitectures": "native",
	}
	for k, v := range want {
		if got, ok := svc[k]; !ok || !slices.Contains(got, v) {
			t.Errorf("%s: [Service] %s: got = %q, expected: %q", path, k, got, v)
		}
	}
	if !slices.Contains(svc["SystemCallFilter"], "@system-service") {
		t.Errorf("%s: SystemCallFilter: got = %q, expected: @system-service among them", path, svc["SystemCallFilter"])
	}
	if af := first(svc["RestrictAddressFamilies"]); !strings.Contains(af, "AF_INET") || !strings.Contains(af, "AF_INET6") {
		t.Errorf("%s: RestrictAddressFamilies: got = %q, expected: AF_INET and AF_INET6 among them", path, af)
	}
	if first(svc["User"]) == "" && first(svc["DynamicUser"]) != "yes" {
		t.Errorf("%s: the unit names no User= and no DynamicUser=yes: it would run as root", path)
	}
	if n, err := strconv.Atoi(first(svc["LimitNOFILE"])); err != nil || n < 4096 {
		t.Errorf("%s: LimitNOFILE: got = %q, expected: at least 4096", path, first(svc["LimitNOFILE"]))
	}
	// A draining node may take about 10 s (docs/operations.md).
	if d, err := time.ParseDuration(first(svc["TimeoutStopSec"])); err != nil || d < 15*time.Second {
		t.Errorf("%s: TimeoutStopSec: got = %q, expected: at least 15s", path, first(svc["TimeoutStopSec"]))
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed: the unit is not verified by systemd (.ci/run installs it)")
		return
	}
	// verify wants ExecStart's program to exist: a stub stands in.
	dir := t.TempDir()
	stub := filepath.Join(dir, "tenure")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "tenure.service")
	if err := os.WriteFile(copyPath, bytes.ReplaceAll(b, []byte(execStart[0]), []byte(stub)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", copyPath).CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("tenure.service")) {
		t.Errorf("systemd-analyze verify %s: got = %v, %q, expected: no complaint about the unit", path, err, out)
	}
}

// readUnit reads a systemd unit into its sections' keys, each with every
// value given for it (a key may repeat).
func readUnit(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string]map[string][]string{}
	var section string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		for strings.HasSuffix(line, "\\") && sc.Scan() {
			n++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(sc.Text())
		}
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			unit[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: %q: not KEY=VALUE in a section", path, n, line)
			}
			unit[section][k] = append(unit[section][k], v)
		}
	}
	return unit
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// TestInstallDocs checks docs/operations.md's "Install and run": every
// `tenure ...` command line in its sh blocks parses (TestDocumentedCommandsParse
// does the same for the README and docs/cli.md), leading VAR=value
// assignments included, and every yaml block applies as a serve config.
func TestInstallDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Install and run\n")
	if start < 0 {
		t.Fatal(`docs/operations.md: no "## Install and run" section`)
	}
	section := doc[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	commands, configs := 0, 0
	var block []string
	lang, in := "", false
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "```") {
			if in && lang == "yaml" {
				path := writeConfig(t, strings.Join(block, "\n"))
				if _, err := parseServe(t, nil, "--config", path); err != nil {
					t.Errorf("docs/operations.md: yaml block %q: %v", block, err)
				}
				configs++
			}
			in, lang, block = !in, strings.TrimPrefix(line, "```"), nil
			continue
		}
		if !in {
			continue
		}
		block = append(block, line)
		if lang != "sh" {
			continue
		}
		words, err := shellWords(strings.TrimSpace(line))
		if err != nil {
			continue // a line of a heredoc, or a continued command
		}
		for len(words) > 0 && regexp.MustCompile(`^[A-Z_]+=`).MatchString(words[0]) {
			words = words[1:]
		}
		if len(words) == 0 || words[0] != "tenure" {
			continue
		}
		if err := parseOnly(words[1:]); err != nil {
			t.Errorf("docs/operations.md: %q: got = %v, expected: a valid command line", line, err)
		}
		commands++
	}
	if commands < 5 || configs < 1 {
		t.Errorf("docs/operations.md, Install and run: got = %d commands and %d configs checked, expected: at least 5 and 1", commands, configs)
	}
}

// TestBuildScriptWithoutOutputPrintsUsage: scripts/build.sh without its
// argument says how to call it and exits 2, rather than a shell error
// ("line 17: 1: usage: ..."); --help prints the same and exits 0.
func TestBuildScriptWithoutOutputPrintsUsage(t *testing.T) {
	const want = "usage: scripts/build.sh OUT    (the binary to write; /dev/null checks that it builds)\n"
	cmd := exec.Command("bash", filepath.Join(repoRoot, "scripts/build.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || stderr.String() != want {
		t.Errorf("scripts/build.sh: got = %v, stderr %q, expected: exit 2 and %q", err, stderr.String(), want)
	}
	out, err := exec.Command("bash", filepath.Join(repoRoot, "scripts/build.sh"), "--help").Output()
	if err != nil || string(out) != want {
		t.Errorf("scripts/build.sh --help: got = %v, %q, expected: exit 0 and %q", err, out, want)
	}
}

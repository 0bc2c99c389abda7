package cli

// The packaging under deploy/ and the Dockerfile are not run by CI (no
// docker, no systemd, no Kubernetes): these tests read them and check
// what can be checked here. Every `tenure serve` command line in them is
// parsed by the real serve command, every key of the example config is
// applied as serve applies it, and the manifests are decoded strictly
// into the fields this file knows, then checked for what a cluster needs.

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
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
	"sigs.k8s.io/yaml"
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

// TestDockerfile checks the Dockerfile's shape: a Go build stage on the
// Go release go.mod asks for, building with scripts/build.sh (the build
// CI runs); a final stage without root, its data in a volume, the ports
// exposed, and a command serve accepts.
func TestDockerfile(t *testing.T) {
	path := filepath.Join(repoRoot, "Dockerfile")
	stages := readDockerfile(t, path)
	if len(stages) < 2 {
		t.Fatalf("%s: got = %d stages, expected: a build stage and a final one", path, len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]

	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	image := regexp.MustCompile(`golang:(\d+\.\d+)(\.\d+)?\b`).FindStringSubmatch(build.from)
	if goLine == nil || image == nil || image[1] != string(goLine[1]) {
		t.Errorf("%s: build stage FROM %q: expected: a golang:%s.N image, the Go of go.mod", path, build.from, goLine[1])
	}
	if !slices.ContainsFunc(build.all("RUN"), func(r string) bool { return strings.Contains(r, "./scripts/build.sh ") }) {
		t.Errorf("%s: the build stage does not RUN ./scripts/build.sh, the build CI runs (scripts/release-check.sh)", path)
	}
	script, err := os.ReadFile(filepath.Join(repoRoot, "scripts/build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"CGO_ENABLED=0", "-trimpath", `ldflags="-s -w`} {
		if !bytes.Contains(script, []byte(w)) {
			t.Errorf("scripts/build.sh: expected: %s", w)
		}
	}

	if !strings.Contains(final.from, "distroless/static") && final.from != "scratch" {
		t.Errorf("%s: final stage FROM %q: expected: distroless static or scratch", path, final.from)
	}
	user := final.last("USER")
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("%s: USER %q: expected: a numeric UID other than 0 (Kubernetes' runAsNonRoot checks it)", path, user)
	}
	if got := final.last("ENTRYPOINT"); got != `["tenure"]` {
		t.Errorf(`%s: ENTRYPOINT: got = %s, expected: ["tenure"]`, path, got)
	}
	var cmdArgs []string
	if err := json.Unmarshal([]byte(final.last("CMD")), &cmdArgs); err != nil || len(cmdArgs) == 0 || cmdArgs[0] != "serve" {
		t.Fatalf("%s: CMD %s: expected: a JSON array starting with serve (%v)", path, final.last("CMD"), err)
	}
	cmd, err := parseServeArgs(cmdArgs[1:])
	if err != nil {
		t.Fatalf("%s: CMD: %v", path, err)
	}
	dataDir := flagString(t, cmd, "data-dir")
	if got := final.last("VOLUME"); got != dataDir {
		t.Errorf("%s: VOLUME %q: expected: the CMD's --data-dir, %q", path, got, dataDir)
	}
	owned := slices.ContainsFunc(final.all("COPY"), func(c string) bool {
		f := strings.Fields(c)
		return slices.Contains(f, "--chown="+user) && f[len(f)-1] == dataDir
	})
	if !owned {
		t.Errorf("%s: no COPY --chown=%s creates %s: a new volume there would not be writable by the user", path, user, dataDir)
	}
	exposed := strings.Fields(final.last("EXPOSE"))
	for _, flag := range []string{"listen", "peer-listen"} {
		_, port, _ := net.SplitHostPort(flagString(t, cmd, flag))
		if flag == "peer-listen" {
			port = "7481" // the CMD leaves it on loopback; a cluster sets it
		}
		if !slices.Contains(exposed, port) {
			t.Errorf("%s: EXPOSE %q: expected: port %s of --%s", path, exposed, port, flag)
		}
	}
}

type dockerStage struct {
	from         string
	instructions [][2]string // instruction, arguments
}

func (s dockerStage) all(inst string) []string {
	var out []string
	for _, i := range s.instructions {
		if i[0] == inst {
			out = append(out, i[1])
		}
	}
	return out
}

func (s dockerStage) last(inst string) string {
	all := s.all(inst)
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1]
}

// readDockerfile splits a Dockerfile into stages of instructions, with
// continued lines joined and comments dropped.
func readDockerfile(t *testing.T, path string) []dockerStage {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages []dockerStage
	var cur string
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		cur += " " + trimmed
		if strings.HasSuffix(cur, "\\") {
			cur = strings.TrimSuffix(cur, "\\")
			continue
		}
		inst, args, _ := strings.Cut(strings.TrimSpace(cur), " ")
		cur = ""
		inst = strings.ToUpper(inst)
		args = strings.Join(strings.Fields(args), " ")
		switch inst {
		case "":
		case "FROM":
			from := strings.Fields(args)
			if len(from) > 0 && strings.HasPrefix(from[0], "--platform") {
				from = from[1:]
			}
			stages = append(stages, dockerStage{from: from[0]})
		default:
			if len(stages) == 0 {
				if inst == "ARG" {
					continue
				}
				t.Fatalf("%s: %s before FROM", path, inst)
			}
			s := &stages[len(stages)-1]
			s.instructions = append(s.instructions, [2]string{inst, args})
		}
	}
	return stages
}

// TestDockerignore checks that .dockerignore leaves in the build context
// every file `go build ./cmd/tenure` reads, nested modules included:
// CI never runs docker build, which would fail without them.
func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if line[0] == '!' {
			t.Fatalf(".dockerignore: %q: exceptions are not understood by this test; teach it, or do without", line)
		}
		patterns = append(patterns, strings.Trim(filepath.ToSlash(filepath.Clean(line)), "/"))
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "list", "-deps", "-f", `{{if not .Standard}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}`, "../../cmd/tenure").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	files := []string{"go.mod", "go.sum", "scripts/build.sh", "cmd/tenure/main.go"}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		rel, err := filepath.Rel(root, f[0])
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a dependency from the module cache
		}
		for _, name := range f[1:] {
			files = append(files, filepath.ToSlash(filepath.Join(rel, name)))
		}
		// A nested module's go.mod and go.sum (api, client, fence).
		for d := rel; d != "." && d != "/"; d = filepath.Dir(d) {
			for _, m := range []string{"go.mod", "go.sum"} {
				if _, err := os.Stat(filepath.Join(root, d, m)); err == nil {
					files = append(files, filepath.ToSlash(filepath.Join(d, m)))
				}
			}
		}
	}
	if len(files) < 50 {
		t.Fatalf("go list found %d files of this repository in the build, expected: many more", len(files))
	}
	for _, f := range files {
		if p := dockerignored(f, patterns); p != "" {
			t.Errorf(".dockerignore: %q leaves out %s, which the image's build reads", p, f)
		}
	}
}

// dockerignored returns the pattern that excludes path (slash-separated,
// relative to the context), or "". A pattern matches the path or any
// directory above it; **/ at its start matches at any depth.
func dockerignored(path string, patterns []string) string {
	parts := strings.Split(path, "/")
	for _, p := range patterns {
		anyDepth := strings.HasPrefix(p, "**/")
		p2 := strings.TrimPrefix(p, "**/")
		for end := 1; end <= len(parts); end++ {
			starts := []int{0}
			if anyDepth {
				starts = starts[:0]
				for s := 0; s < end; s++ {
					starts = append(starts, s)
				}
			}
			for _, s := range starts {
				if ok, _ := filepath.Match(p2, strings.Join(parts[s:end], "/")); ok {
					return p
				}
			}
		}
	}
	return ""
}

func TestDockerignored(t *testing.T) {
	pats := []string{".git", "docs", "**/tenure-data", "**/*.test", "tenure"}
	tests := []struct{ path, want string }{
		{".git/config", ".git"},
		{"docs/operations.md", "docs"},
		{"internal/docs/x.go", ""},
		{"a/b/tenure-data/raft/x", "**/tenure-data"},
		{"cli.test", "**/*.test"},
		{"internal/cli/cli.test", "**/*.test"},
		{"tenure", "tenure"},
		{"cmd/tenure/main.go", ""},
	}
	for _, tt := range tests {
		if got := dockerignored(tt.path, pats); got != tt.want {
			t.Errorf("dockerignored(%q): got = %q, expected: %q", tt.path, got, tt.want)
		}
	}
}

// Kubernetes objects, with the fields the manifests use. Decoding is
// strict, so a misspelt field fails here rather than at kubectl apply.
type (
	k8sMeta struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels,omitempty"`
	}
	k8sSelector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	}
	k8sService struct {
		APIVersion string  `json:"apiVersion"`
		Kind       string  `json:"kind"`
		Metadata   k8sMeta `json:"metadata"`
		Spec       struct {
			Type                     string            `json:"type,omitempty"`
			ClusterIP                string            `json:"clusterIP,omitempty"`
			PublishNotReadyAddresses bool              `json:"publishNotReadyAddresses,omitempty"`
			Selector                 map[string]string `json:"selector"`
			Ports                    []k8sServicePort  `json:"ports"`
		} `json:"spec"`
	}
	k8sServicePort struct {
		Name       string `json:"name"`
		Port       int    `json:"port"`
		TargetPort any    `json:"targetPort,omitempty"`
	}
	k8sPDB struct {
		APIVersion string  `json:"apiVersion"`
		Kind       string  `json:"kind"`
		Metadata   k8sMeta `json:"metadata"`
		Spec       struct {
			MaxUnavailable any         `json:"maxUnavailable,omitempty"`
			MinAvailable   any         `json:"minAvailable,omitempty"`
			Selector       k8sSelector `json:"selector"`
		} `json:"spec"`
	}
	k8sProbe struct {
		HTTPGet *struct {
			Path   string `json:"path"`
			Port   any    `json:"port"`
			Scheme string `json:"scheme,omitempty"`
		} `json:"httpGet,omitempty"`
		InitialDelaySeconds int `json:"initialDelaySeconds,omitempty"`
		PeriodSeconds       int `json:"periodSeconds,omitempty"`
		FailureThreshold    int `json:"failureThreshold,omitempty"`
	}
	k8sContainer struct {
		Name            string `json:"name"`
		Image           string `json:"image"`
		ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
		Env             []struct {
			Name      string `json:"name"`
			Value     string `json:"value,omitempty"`
			ValueFrom *struct {
				FieldRef struct {
					FieldPath string `json:"fieldPath"`
				} `json:"fieldRef"`
			} `json:"valueFrom,omitempty"`
		} `json:"env,omitempty"`
		Command []string `json:"command,omitempty"`
		Args    []string `json:"args,omitempty"`
		Ports   []struct {
			Name          string `json:"name"`
			ContainerPort int    `json:"containerPort"`
		} `json:"ports"`
		ReadinessProbe *k8sProbe `json:"readinessProbe,omitempty"`
		LivenessProbe  *k8sProbe `json:"livenessProbe,omitempty"`
		Resources      struct {
			Requests map[string]any `json:"requests,omitempty"`
			Limits   map[string]any `json:"limits,omitempty"`
		} `json:"resources"`
		SecurityContext struct {
			AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation,omitempty"`
			ReadOnlyRootFilesystem   *bool `json:"readOnlyRootFilesystem,omitempty"`
			Capabilities             struct {
				Drop []string `json:"drop,omitempty"`
			} `json:"capabilities"`
		} `json:"securityContext"`
		VolumeMounts []struct {
			Name      string `json:"name"`
			MountPath string `json:"mountPath"`
			ReadOnly  bool   `json:"readOnly,omitempty"`
		} `json:"volumeMounts,omitempty"`
	}
	k8sStatefulSet struct {
		APIVersion string  `json:"apiVersion"`
		Kind       string  `json:"kind"`
		Metadata   k8sMeta `json:"metadata"`
		Spec       struct {
			Replicas            *int   `json:"replicas"`
			ServiceName         string `json:"serviceName"`
			PodManagementPolicy string `json:"podManagementPolicy,omitempty"`
			UpdateStrategy      struct {
				Type string `json:"type"`
			} `json:"updateStrategy"`
			PersistentVolumeClaimRetentionPolicy struct {
				WhenScaled  string `json:"whenScaled,omitempty"`
				WhenDeleted string `json:"whenDeleted,omitempty"`
			} `json:"persistentVolumeClaimRetentionPolicy"`
			Selector k8sSelector `json:"selector"`
			Template struct {
				Metadata k8sMeta `json:"metadata"`
				Spec     struct {
					EnableServiceLinks            *bool `json:"enableServiceLinks,omitempty"`
					TerminationGracePeriodSeconds *int  `json:"terminationGracePeriodSeconds,omitempty"`
					SecurityContext               struct {
						RunAsNonRoot   *bool  `json:"runAsNonRoot,omitempty"`
						RunAsUser      *int64 `json:"runAsUser,omitempty"`
						RunAsGroup     *int64 `json:"runAsGroup,omitempty"`
						FSGroup        *int64 `json:"fsGroup,omitempty"`
						SeccompProfile struct {
							Type string `json:"type"`
						} `json:"seccompProfile"`
					} `json:"securityContext"`
					TopologySpreadConstraints []struct {
						MaxSkew           int         `json:"maxSkew"`
						TopologyKey       string      `json:"topologyKey"`
						WhenUnsatisfiable string      `json:"whenUnsatisfiable"`
						LabelSelector     k8sSelector `json:"labelSelector"`
					} `json:"topologySpreadConstraints,omitempty"`
					Containers []k8sContainer `json:"containers"`
					Volumes    []struct {
						Name   string `json:"name"`
						Secret *struct {
							SecretName  string `json:"secretName"`
							DefaultMode *int   `json:"defaultMode,omitempty"`
						} `json:"secret,omitempty"`
					} `json:"volumes,omitempty"`
				} `json:"spec"`
			} `json:"template"`
			VolumeClaimTemplates []struct {
				Metadata k8sMeta `json:"metadata"`
				Spec     struct {
					AccessModes []string `json:"accessModes"`
					Resources   struct {
						Requests map[string]any `json:"requests"`
					} `json:"resources"`
				} `json:"spec"`
			} `json:"volumeClaimTemplates"`
		} `json:"spec"`
	}
)

// k8sDoc is one document of a manifest file.
type k8sDoc struct {
	where string // file:document
	kind  string
	name  string
	obj   any // *k8sService, *k8sPDB or *k8sStatefulSet
}

// readManifests decodes every document of every YAML file in dir,
// strictly, into the type of its kind.
func readManifests(t *testing.T, dir string) []k8sDoc {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("%s: no manifests (%v)", dir, err)
	}
	var docs []k8sDoc
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			where := fmt.Sprintf("%s (document %d)", filepath.Base(path), i+1)
			var head struct {
				APIVersion string  `json:"apiVersion"`
				Kind       string  `json:"kind"`
				Metadata   k8sMeta `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if head.APIVersion == "" && head.Kind == "" && strings.TrimSpace(stripComments(doc)) == "" {
				continue // only comments
			}
			var obj any
			switch head.APIVersion + " " + head.Kind {
			case "v1 Service":
				obj = &k8sService{}
			case "policy/v1 PodDisruptionBudget":
				obj = &k8sPDB{}
			case "apps/v1 StatefulSet":
				obj = &k8sStatefulSet{}
			default:
				t.Errorf("%s: apiVersion %q, kind %q: this test knows v1 Service, policy/v1 PodDisruptionBudget and apps/v1 StatefulSet; teach it the new kind's fields and checks", where, head.APIVersion, head.Kind)
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s: %s %s: %v (a misspelt field, or one this test's types lack)", where, head.Kind, head.Metadata.Name, err)
				continue
			}
			if head.Metadata.Name == "" {
				t.Errorf("%s: %s has no metadata.name", where, head.Kind)
			}
			docs = append(docs, k8sDoc{where: where, kind: head.Kind, name: head.Metadata.Name, obj: obj})
		}
	}
	return docs
}

func stripComments(doc string) string {
	var out []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKubernetesManifests checks deploy/kubernetes: each document is a
// kind the test knows, with no unknown field; the StatefulSet's args are
// a serve command that serve accepts and that forms a cluster of its
// replicas (bootstrap-expect, join naming every pod as it advertises
// itself, a stable raft address per pod); the Services and the
// PodDisruptionBudget select its pods; and its pods run without root.
func TestKubernetesManifests(t *testing.T) {
	docs := readManifests(t, filepath.Join(repoRoot, "deploy/kubernetes"))
	services := map[string]*k8sService{}
	var sets []*k8sStatefulSet
	var pdbs []*k8sPDB
	for _, d := range docs {
		switch o := d.obj.(type) {
		case *k8sService:
			if services[d.name] != nil {
				t.Errorf("%s: a second Service %s", d.where, d.name)
			}
			services[d.name] = o
		case *k8sStatefulSet:
			sets = append(sets, o)
		case *k8sPDB:
			pdbs = append(pdbs, o)
		}
	}
	if len(sets) != 1 {
		t.Fatalf("StatefulSets: got = %d, expected: 1", len(sets))
	}
	ss := sets[0]
	spec := &ss.Spec
	pod := ss.Spec.Template.Spec
	podLabels := spec.Template.Metadata.Labels
	if spec.Replicas == nil || *spec.Replicas < 3 || *spec.Replicas%2 == 0 {
		t.Fatalf("StatefulSet %s: replicas: got = %v, expected: an odd number, at least 3", ss.Metadata.Name, spec.Replicas)
	}
	replicas := *spec.Replicas
	if !selects(spec.Selector.MatchLabels, podLabels) {
		t.Errorf("StatefulSet %s: selector %v does not select its pods' labels %v", ss.Metadata.Name, spec.Selector.MatchLabels, podLabels)
	}
	if spec.PodManagementPolicy != "Parallel" {
		t.Errorf("StatefulSet %s: podManagementPolicy: got = %q, expected: Parallel (a node is ready only once the others have started)", ss.Metadata.Name, spec.PodManagementPolicy)
	}
	if spec.PersistentVolumeClaimRetentionPolicy.WhenScaled != "Delete" {
		t.Errorf("StatefulSet %s: persistentVolumeClaimRetentionPolicy.whenScaled: got = %q, expected: Delete (a removed member must not come back on its old data)", ss.Metadata.Name, spec.PersistentVolumeClaimRetentionPolicy.WhenScaled)
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Errorf("StatefulSet %s: enableServiceLinks: expected: false, or Services named tenure* put TENURE_* variables in serve's environment", ss.Metadata.Name)
	}
	if g := pod.TerminationGracePeriodSeconds; g != nil && *g < 15 {
		t.Errorf("StatefulSet %s: terminationGracePeriodSeconds: got = %d, expected: at least 15 (a draining node takes up to about 10 s)", ss.Metadata.Name, *g)
	}
	sc := pod.SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 || sc.FSGroup == nil {
		t.Errorf("StatefulSet %s: securityContext: expected: runAsNonRoot, a runAsUser other than 0 and an fsGroup (so the volume is writable)", ss.Metadata.Name)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("StatefulSet %s: containers: got = %d, expected: 1", ss.Metadata.Name, len(pod.Containers))
	}
	c := pod.Containers[0]
	csc := c.SecurityContext
	if csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || !slices.Contains(csc.Capabilities.Drop, "ALL") {
		t.Errorf("container %s: securityContext: expected: readOnlyRootFilesystem, no allowPrivilegeEscalation, and capabilities dropped (ALL)", c.Name)
	}

	// The command line, with its $(VAR)s as Kubernetes expands them.
	if len(c.Command) > 0 || len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("container %s: expected: no command (the image's entrypoint is tenure) and args starting with serve; got command %q, args %q", c.Name, c.Command, c.Args)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		} else {
			env[e.Name] = e.Value
		}
	}
	if env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Fatalf("container %s: env: expected: POD_NAME and POD_NAMESPACE from the downward API (metadata.name, metadata.namespace), got %v", c.Name, env)
	}
	varRef := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, a := range c.Args {
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			if _, ok := env[m[1]]; !ok {
				t.Errorf("container %s: arg %q: $(%s) is not in the container's env, so Kubernetes leaves it as written", c.Name, a, m[1])
			}
		}
	}
	const ns = "ns"
	expand := func(s, podName string) string {
		return strings.NewReplacer("$(POD_NAME)", podName, "$(POD_NAMESPACE)", ns).Replace(s)
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	mounts := map[string]string{} // mount path: volume
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	secretVolumes := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.Secret != nil {
			secretVolumes[v.Name] = true
		}
	}
	claims := map[string]bool{}
	for _, vct := range spec.VolumeClaimTemplates {
		claims[vct.Metadata.Name] = true
	}

	var joins [][]string
	for i := range replicas {
		podName := fmt.Sprintf("%s-%d", ss.Metadata.Name, i)
		args := make([]string, len(c.Args)-1)
		for j, a := range c.Args[1:] {
			args[j] = expand(a, podName)
		}
		cmd, err := parseServeArgs(args)
		if err != nil {
			t.Fatalf("pod %s: serve %q: %v", podName, args, err)
		}
		where := "pod " + podName
		checkExposed(t, where, cmd)
		get := func(name string) string { v, _ := cmd.Flags().GetString(name); return v }
		port := func(flag string) int {
			_, p, err := net.SplitHostPort(get(flag))
			n, _ := strconv.Atoi(p)
			if err != nil {
				t.Errorf("%s: --%s %q: %v", where, flag, get(flag), err)
			}
			return n
		}
		if n, _ := cmd.Flags().GetInt("bootstrap-expect"); n != replicas {
			t.Errorf("%s: --bootstrap-expect: got = %d, expected: the replicas, %d", where, n, replicas)
		}
		if get("node-id") != podName {
			t.Errorf("%s: --node-id: got = %q, expected: the pod's name, stable across restarts", where, get("node-id"))
		}
		if port("listen") != ports["api"] || port("peer-listen") != ports["raft"] {
			t.Errorf("%s: --listen %s and --peer-listen %s: expected: the container ports named api (%d) and raft (%d)", where, get("listen"), get("peer-listen"), ports["api"], ports["raft"])
		}
		// The API address: the pod's name under the headless Service.
		headless := services[spec.ServiceName]
		wantAdvertise := fmt.Sprintf("%s.%s.%s.svc:%d", podName, spec.ServiceName, ns, ports["api"])
		if get("advertise") != wantAdvertise {
			t.Errorf("%s: --advertise: got = %q, expected: %q, the pod's DNS name", where, get("advertise"), wantAdvertise)
		}
		// The raft address: a Service of the pod's own, whose cluster IP
		// outlives the pod's (raft keeps the address it resolved).
		host, _, _ := net.SplitHostPort(get("peer-advertise"))
		if want := fmt.Sprintf("%s.%s.svc", podName, ns); host != want || port("peer-advertise") != ports["raft"] {
			t.Errorf("%s: --peer-advertise: got = %q, expected: %s:%d, the pod's own Service", where, get("peer-advertise"), want, ports["raft"])
		} else if s := services[podName]; s == nil {
			t.Errorf("%s: --peer-advertise names Service %s, which the manifests lack", where, podName)
		} else {
			want := map[string]string{"statefulset.kubernetes.io/pod-name": podName}
			if !selects(want, s.Spec.Selector) || !selects(s.Spec.Selector, mergeLabels(podLabels, want)) || !s.Spec.PublishNotReadyAddresses || s.Spec.ClusterIP == "None" {
				t.Errorf("Service %s: expected: a cluster IP selecting pod %s alone, published before it is ready; got %+v", podName, podName, s.Spec)
			}
			if !slices.ContainsFunc(s.Spec.Ports, func(p k8sServicePort) bool { return p.Port == ports["raft"] }) {
				t.Errorf("Service %s: no port %d (raft)", podName, ports["raft"])
			}
		}
		if headless == nil || headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses || !selects(headless.Spec.Selector, podLabels) {
			t.Errorf("StatefulSet %s: serviceName %q: expected: a headless Service (clusterIP: None) selecting its pods and publishing them before they are ready", ss.Metadata.Name, spec.ServiceName)
		}
		join, _ := cmd.Flags().GetStringSlice("join")
		joins = append(joins, join)
		// A node skips its own address in --join by comparing it with
		// --advertise, so the pod's entry must be spelt the same.
		if len(join) != replicas || !slices.Contains(join, get("advertise")) {
			t.Errorf("%s: --join %q: expected: the %d pods' addresses, this pod's spelt as its --advertise %q", where, join, replicas, get("advertise"))
		}
		if !strings.HasPrefix(get("data-dir"), "/") || !claims[mounts[get("data-dir")]] {
			t.Errorf("%s: --data-dir %q: expected: the mount path of a volumeClaimTemplate", where, get("data-dir"))
		}
		for _, flag := range []string{"cert-file", "key-file", "client-ca-file", "peer-cert-file", "peer-key-file", "peer-ca-file", "policy"} {
			v := get(flag)
			if v == "" {
				continue
			}
			if dir := filepath.Dir(v); !secretVolumes[mounts[dir]] {
				t.Errorf("%s: --%s %s: expected: in a Secret's mount, got %q mounted from %q", where, flag, v, dir, mounts[dir])
			}
		}
		scheme := "HTTP"
		if get("cert-file") != "" {
			scheme = "HTTPS"
		}
		for _, p := range []struct {
			name, path string
			probe      *k8sProbe
		}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/livez", c.LivenessProbe}} {
			if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != "api" || strings.ToUpper(cmp.Or(p.probe.HTTPGet.Scheme, "HTTP")) != scheme {
				t.Errorf("container %s: %s: expected: GET %s on port api over %s", c.Name, p.name, p.path, scheme)
			}
		}
	}
	for i := 1; i < len(joins); i++ {
		if !slices.Equal(joins[i], joins[0]) {
			t.Errorf("--join differs between pods: %q and %q", joins[0], joins[i])
		}
	}

	for name, s := range services {
		if !selects(s.Spec.Selector, mergeLabels(podLabels, map[string]string{"statefulset.kubernetes.io/pod-name": s.Spec.Selector["statefulset.kubernetes.io/pod-name"]})) {
			t.Errorf("Service %s: selector %v selects no pod of StatefulSet %s", name, s.Spec.Selector, ss.Metadata.Name)
		}
		for _, p := range s.Spec.Ports {
			if tp, ok := p.TargetPort.(string); ok && ports[tp] == 0 {
				t.Errorf("Service %s: targetPort %q: the container has no such port", name, tp)
			}
		}
	}
	if len(pdbs) != 1 {
		t.Fatalf("PodDisruptionBudgets: got = %d, expected: 1", len(pdbs))
	}
	if pdb := pdbs[0]; fmt.Sprint(pdb.Spec.MaxUnavailable) != "1" || !selects(pdb.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("PodDisruptionBudget %s: expected: maxUnavailable 1, selecting the StatefulSet's pods; got %+v", pdb.Metadata.Name, pdb.Spec)
	}
}

func mergeLabels(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if v != "" {
			out[k] = v
		}
	}
	return out
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

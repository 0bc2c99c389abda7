package cli

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

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

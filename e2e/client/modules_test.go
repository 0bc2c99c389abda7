package client_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// serverModules are the modules a program that imports the client must
// not inherit: the server's raft, its log stores, its CLI, its metrics,
// the benchmark harness's etcd and charts, the web test's browser, and
// the core module itself. A path matches one of them if it is that path
// or lies under it ("github.com/hashicorp/raft" also stands for raft-wal
// and raft-boltdb/v2).
var serverModules = []string{
	"github.com/hashicorp/raft",
	"go.etcd.io/bbolt",
	"github.com/boltdb/bolt",
	"github.com/chromedp",
	"github.com/spf13/cobra",
	"github.com/prometheus/client_golang",
	"go.etcd.io/etcd",
	"gonum.org/v1/plot",
	"github.com/tenurehq/tenure",
}

// clientModules are the modules under github.com/tenurehq/tenure that a
// client program does get.
var clientModules = map[string]bool{
	"github.com/tenurehq/tenure/api":    true,
	"github.com/tenurehq/tenure/client": true,
	"github.com/tenurehq/tenure/fence":  true,
}

// fromTheServer reports whether module path is one of serverModules.
func fromTheServer(path string) bool {
	if clientModules[path] {
		return false
	}
	for _, p := range serverModules {
		if path == p || strings.HasPrefix(path, p+"/") || strings.HasPrefix(path, p+"-") {
			return true
		}
	}
	return false
}

// repoRoot is the checkout this test runs in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "client", "go.mod")); err != nil {
		t.Fatalf("no client module under %s: %v", root, err)
	}
	return root
}

// goCmd runs the go command in dir, with no workspace and the given
// -mod mode, and returns its standard output. Modules come from the
// module cache, which the core's own build has filled; the proxy is asked
// only for what is missing.
func goCmd(t *testing.T, dir, mod string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod="+mod)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return string(out)
}

// buildList is `go list -m all` in dir: the module paths of its build
// list, itself first.
func buildList(t *testing.T, dir, mod string) []string {
	t.Helper()
	var paths []string
	for _, line := range strings.Split(strings.TrimSpace(goCmd(t, dir, mod, "list", "-m", "all")), "\n") {
		paths = append(paths, strings.Fields(line)[0])
	}
	return paths
}

// graphModules is every module path in `go mod graph` in dir, at any
// version: wider than the build list, which keeps only selected versions.
func graphModules(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	for _, field := range strings.Fields(goCmd(t, dir, "mod", "mod", "graph")) {
		path, _, _ := strings.Cut(field, "@")
		paths = append(paths, path)
	}
	slices.Sort(paths)
	return slices.Compact(paths)
}

func serverModulesIn(paths []string) []string {
	var found []string
	for _, p := range paths {
		if fromTheServer(p) {
			found = append(found, p)
		}
	}
	return found
}

// TestClientModulesLeaveOutTheServer: the api, client and fence modules'
// build lists, their tests' included (a go.mod cannot keep a test's
// requirements from its importers), hold no module of the server. And
// the check can fail: the core's own list holds them.
func TestClientModulesLeaveOutTheServer(t *testing.T) {
	root := repoRoot(t)
	for _, mod := range []string{"api", "client", "fence"} {
		paths := buildList(t, filepath.Join(root, mod), "readonly")
		if want := "github.com/tenurehq/tenure/" + mod; paths[0] != want {
			t.Errorf("%s: main module got = %s, expected: %s", mod, paths[0], want)
		}
		if found := serverModulesIn(paths); len(found) > 0 {
			t.Errorf("%s: server modules in the build list got = %v, expected: none", mod, found)
		}
		if found := serverModulesIn(graphModules(t, filepath.Join(root, mod))); len(found) > 0 {
			t.Errorf("%s: server modules in the module graph got = %v, expected: none", mod, found)
		}
	}
	found := strings.Join(serverModulesIn(buildList(t, root, "readonly")), " ")
	for _, want := range []string{"github.com/tenurehq/tenure", "github.com/hashicorp/raft", "github.com/spf13/cobra"} {
		if !strings.Contains(found, want) {
			t.Errorf("core: server modules got = %s, expected: %s among them (is the check blind?)", found, want)
		}
	}
}

// forbiddingProxy is a module proxy that answers 403 to everything, as
// some company proxies do for modules they do not know (where
// proxy.golang.org answers 404, on which go falls back). It fails the test
// if anything asks it about the tenure modules, and returns its URL.
func forbiddingProxy(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "tenurehq") {
			t.Errorf("module proxy asked for %s, expected: no question about the tenure modules", r.URL.Path)
		}
		http.Error(w, "forbidden", http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestReadmeGoClientBuildsAlone follows the README from a new module,
// behind a module proxy that answers 403 to everything: its setup
// commands (replace and require lines pointing at this checkout), its Go
// example as the body of main, and package fence beside it. The program
// builds, and its module graph holds nothing of the server.
func TestReadmeGoClientBuildsAlone(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	setup := readmeBlock(t, string(readme), "go-client-setup", "sh")
	example := readmeBlock(t, string(readme), "go-client", "go")
	if !strings.Contains(setup, "/path/to/tenure") {
		t.Fatalf("README go-client-setup got = %q, expected: commands naming /path/to/tenure", setup)
	}

	app := t.TempDir()
	goCmd(t, app, "mod", "mod", "init", "example.com/app")
	// Seed go.sum with the hashes the client modules already vouch for,
	// so that go get need not ask the checksum database.
	var sums []string
	for _, mod := range []string{"api", "client", "fence"} {
		b, err := os.ReadFile(filepath.Join(root, mod, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, strings.SplitAfter(string(b), "\n")...)
	}
	slices.Sort(sums)
	if err := os.WriteFile(filepath.Join(app, "go.sum"), []byte(strings.Join(slices.Compact(sums), "")), 0o644); err != nil {
		t.Fatal(err)
	}
	// The README's commands run on a module cache that holds what the
	// client modules need (go mod download fetches only what is missing),
	// behind a proxy that refuses everything: they must not need one.
	goCmd(t, filepath.Join(root, "client"), "readonly", "mod", "download")
	goCmd(t, filepath.Join(root, "fence"), "readonly", "mod", "download")
	t.Setenv("GOPROXY", forbiddingProxy(t))
	sh := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(setup, "/path/to/tenure", root))
	sh.Dir = app
	sh.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("README go-client-setup failed: %v\n%s", err, out)
	}

	program := `package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
)

func main() {
` + indent(example) + `}

// runReport is the README's job: its writes carry the lock's token.
func runReport(ctx context.Context, tok client.Token) {
	hc := &http.Client{Transport: fence.Transport(nil, fence.ContextSource(ctx))}
	defer hc.CloseIdleConnections()
	log.Printf("report under %s", fence.Format(tok))
}
`
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd(t, app, "mod", "build", "-o", os.DevNull, ".")
	paths := buildList(t, app, "mod")
	for mod := range clientModules {
		if !slices.Contains(paths, mod) {
			t.Errorf("build list got = %v, expected: %s in it", paths, mod)
		}
	}
	if found := serverModulesIn(paths); len(found) > 0 {
		t.Errorf("server modules in the application's build list got = %v, expected: none", found)
	}
	if found := serverModulesIn(graphModules(t, app)); len(found) > 0 {
		t.Errorf("server modules in the application's module graph got = %v, expected: none", found)
	}
}

// TestReadmeGoWorkspaceBuildsOffline follows the README's other way, a
// go.work beside a new module, with no module proxy at all, and builds a
// program that imports the client and fence; its build list holds nothing
// of the server.
func TestReadmeGoWorkspaceBuildsOffline(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	setup := readmeBlock(t, string(readme), "go-client-workspace", "sh")
	goCmd(t, filepath.Join(root, "client"), "readonly", "mod", "download")
	goCmd(t, filepath.Join(root, "fence"), "readonly", "mod", "download")

	app := t.TempDir()
	goCmd(t, app, "mod", "mod", "init", "example.com/app")
	program := `package main

import (
	"fmt"

	"github.com/tenurehq/tenure/client"
	"github.com/tenurehq/tenure/fence"
)

func main() { fmt.Println(client.DefaultNamespace, fence.Header) }
`
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	// GOWORK empty: the go.work the README's command writes is found
	// from app. GOFLAGS=-mod=mod would be refused in workspace mode, as
	// the README says.
	env := append(os.Environ(), "GOWORK=", "GOPROXY=off", "GOFLAGS=-mod=readonly")
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = app
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(setup, "/path/to/tenure", root))
	if _, err := os.Stat(filepath.Join(app, "go.work")); err != nil {
		t.Fatalf("after the README's go-client-workspace block: %v, expected: a go.work in the module", err)
	}
	run("go", "build", "-o", os.DevNull, ".")
	var paths []string
	for _, line := range strings.Split(strings.TrimSpace(run("go", "list", "-m", "all")), "\n") {
		paths = append(paths, strings.Fields(line)[0])
	}
	for mod := range clientModules {
		if !slices.Contains(paths, mod) {
			t.Errorf("workspace build list got = %v, expected: %s in it", paths, mod)
		}
	}
	if found := serverModulesIn(paths); len(found) > 0 {
		t.Errorf("server modules in the workspace's build list got = %v, expected: none", found)
	}
}

// readmeBlock is the code block of language lang that README.md marks
// with <!-- name --> and <!-- /name -->.
func readmeBlock(t *testing.T, readme, name, lang string) string {
	t.Helper()
	_, block, ok := strings.Cut(readme, "<!-- "+name+" -->\n```"+lang+"\n")
	if !ok {
		t.Fatalf("README.md has no <!-- %s --> %s block", name, lang)
	}
	body, _, ok := strings.Cut(block, "```\n<!-- /"+name+" -->")
	if !ok {
		t.Fatalf("README.md's %s block is not closed by <!-- /%s -->", name, name)
	}
	return body
}

func indent(code string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(code, "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString("\t")
		}
		b.WriteString(line)
	}
	return b.String()
}

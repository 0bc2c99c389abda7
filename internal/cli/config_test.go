package cli

import (
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// parseServe parses args as `tenure serve` would, running its real
// PreRunE (--config and the TENURE_* variables) with env set in the
// environment and every other TENURE_<FLAG> variable blanked, and returns
// the command with its flags set instead of serving.
func parseServe(t *testing.T, env map[string]string, args ...string) (*cobra.Command, error) {
	t.Helper()
	root := NewRootCommand()
	serve, _, err := root.Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(configurable(serve), serve.Flags().Lookup(configFlag)) {
		t.Setenv(envName(f.Name), "") // empty counts as unset
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	var ran *cobra.Command
	serve.RunE = func(cmd *cobra.Command, _ []string) error {
		ran = cmd
		return nil
	}
	root.SetArgs(append([]string{"serve"}, args...))
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	if err := root.Execute(); err != nil {
		return nil, err
	}
	return ran, nil
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tenure.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestServeConfigPrecedence(t *testing.T) {
	file := writeConfig(t, `
listen: 127.0.0.1:9001
data-dir: /from/file
lease-gc-after: 3h
min-free-space: 0
log-level: debug
`)
	env := map[string]string{
		"TENURE_DATA_DIR":       "/from/env",
		"TENURE_LEASE_GC_AFTER": "2h",
		"TENURE_LOG_LEVEL":      "warn",
	}
	cmd, err := parseServe(t, env, "--config", file, "--log-level", "error")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, flag, want string
		changed          bool
	}{
		{"the command line wins over the environment and the file", "log-level", "error", true},
		{"the environment wins over the file", "data-dir", "/from/env", true},
		{"the environment wins over the file, for a duration too", "lease-gc-after", "2h0m0s", true},
		{"the file wins over the default", "listen", "127.0.0.1:9001", true},
		{"a value from the file counts as given, so 0 turns the disk reserve off", "min-free-space", "0", true},
		{"a flag named nowhere keeps its default", "peer-listen", "127.0.0.1:7481", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := cmd.Flags().Lookup(tt.flag)
			if got := f.Value.String(); got != tt.want || f.Changed != tt.changed {
				t.Errorf("--%s: got = %q (changed %v), expected: %q (changed %v)", tt.flag, got, f.Changed, tt.want, tt.changed)
			}
		})
	}
}

func TestServeConfigFromEnvironment(t *testing.T) {
	file := writeConfig(t, "listen: 127.0.0.1:9002\n")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string // --listen
	}{
		{"TENURE_CONFIG names the file when --config does not", map[string]string{"TENURE_CONFIG": file}, nil, "127.0.0.1:9002"},
		{"--config wins over TENURE_CONFIG", map[string]string{"TENURE_CONFIG": "/no/such/file.yaml"}, []string{"--config", file}, "127.0.0.1:9002"},
		{"an empty variable counts as unset", map[string]string{"TENURE_CONFIG": file, "TENURE_LISTEN": ""}, nil, "127.0.0.1:9002"},
		{"the client's variables do not reach serve", map[string]string{"TENURE_ENDPOINTS": "10.9.9.9:1", "TENURE_TOKEN": "x"}, nil, "127.0.0.1:7480"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, err := parseServe(t, tt.env, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := cmd.Flags().GetString("listen"); got != tt.want {
				t.Errorf("--listen: got = %q, expected: %q", got, tt.want)
			}
		})
	}
}

func TestServeConfigLists(t *testing.T) {
	want := []string{"10.0.0.2:7480", "10.0.0.3:7480"}
	tests := []struct {
		name string
		yaml string
		env  map[string]string
		args []string
		want []string
	}{
		{name: "a YAML list", yaml: "join: [10.0.0.2:7480, 10.0.0.3:7480]\n", want: want},
		{name: "a YAML block list", yaml: "join:\n  - 10.0.0.2:7480\n  - 10.0.0.3:7480\n", want: want},
		{name: "a comma-separated string, as on the command line", yaml: "join: 10.0.0.2:7480,10.0.0.3:7480\n", want: want},
		{name: "an empty list", yaml: "join: []\n", want: []string{}},
		{name: "a comma-separated variable wins over the file", yaml: "join: [10.9.9.9:7480]\n", env: map[string]string{"TENURE_JOIN": "10.0.0.2:7480,10.0.0.3:7480"}, want: want},
		{name: "the command line replaces the file's list, not adds to it", yaml: "join: [10.9.9.9:7480]\n", args: []string{"--join", "10.0.0.2:7480", "--join", "10.0.0.3:7480"}, want: want},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, err := parseServe(t, tt.env, append([]string{"--config", writeConfig(t, tt.yaml)}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := cmd.Flags().GetStringSlice("join"); !slices.Equal(got, tt.want) {
				t.Errorf("--join: got = %q, expected: %q", got, tt.want)
			}
		})
	}
}

func TestServeConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string // "" for none: no --config
		env  map[string]string
		want []string // in the error, besides the file's path when there is a file
	}{
		{name: "an unknown key names the key and the nearest flag", yaml: "listn: 127.0.0.1:7480\n", want: []string{`unknown key "listn"`, `did you mean "listen"?`}},
		{name: "a key spelt with underscores is pointed to the flag", yaml: "lease_gc_after: 1h\n", want: []string{`unknown key "lease_gc_after"`, `did you mean "lease-gc-after"?`}},
		{name: "a client flag is not a serve key", yaml: "endpoints: 10.0.0.1:7480\n", want: []string{`unknown key "endpoints"`}},
		{name: "a bad value names the key and what its flag said", yaml: "lease-gc-after: soon\n", want: []string{`key "lease-gc-after"`, `invalid duration "soon"`}},
		{name: "a bad number names the key", yaml: "bootstrap-expect: three\n", want: []string{`key "bootstrap-expect"`, `"three"`}},
		{name: "a list for a flag of one value", yaml: "listen: [a:1, b:2]\n", want: []string{`key "listen"`, "a list, but --listen takes one value"}},
		{name: "a mapping for a value", yaml: "listen: {host: a}\n", want: []string{`key "listen"`, "a mapping"}},
		{name: "a key with no value", yaml: "listen:\n", want: []string{`key "listen"`, "no value"}},
		{name: "a file that names another", yaml: "config: other.yaml\n", want: []string{`key "config"`}},
		{name: "a file that is not a mapping", yaml: "- listen\n", want: []string{"want a mapping"}},
		{name: "a file that is not YAML", yaml: "listen: [\n", want: []string{"not valid YAML"}},
		{name: "a missing colon is on its own line, not the next", yaml: "listen: 127.0.0.1:7480\ndata-dir /var/lib/tenure\nlog-level: info\n", want: []string{"not valid YAML: line 2: could not find expected ':'"}},
		{name: "a stray list item is on its own line, not the one before", yaml: "log-level: info\njoin:\n  - a:7480\n b:7480\n", want: []string{"not valid YAML: line 4: did not find expected key"}},
		{name: "an unclosed quote is where it opens", yaml: "log-level: info\nlisten: \"127.0.0.1:7480\ndata-dir: d\n", want: []string{"not valid YAML: line 2: "}},
		{name: "a bad variable names the variable and the flag", env: map[string]string{"TENURE_LEASE_GC_AFTER": "soon"}, want: []string{"TENURE_LEASE_GC_AFTER", "--lease-gc-after", `invalid duration "soon"`}},
		{name: "a missing file", env: map[string]string{"TENURE_CONFIG": "/no/such/tenure.yaml"}, want: []string{"/no/such/tenure.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var args []string
			want := tt.want
			if tt.yaml != "" {
				path := writeConfig(t, tt.yaml)
				args = []string{"--config", path}
				want = append([]string{path}, want...)
			}
			_, err := parseServe(t, tt.env, args...)
			var ee *exitError
			if !errors.As(err, &ee) || ee.code != ExitUsage {
				t.Fatalf("got = %v, expected: a usage error (exit code 2)", err)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got = %q, expected: an error containing %q", err, w)
				}
			}
		})
	}
}

// TestServeConfigCoversEveryFlag sets each flag of serve, those added
// after this test included, to its default from a file and from the
// environment: each must be accepted, so that nothing needs adding to
// config.go when serve gains a flag.
func TestServeConfigCoversEveryFlag(t *testing.T) {
	root := NewRootCommand()
	serve, _, _ := root.Find([]string{"serve"})
	flags := configurable(serve)
	if len(flags) < 40 {
		t.Fatalf("serve flags: got = %d, expected: at least 40", len(flags))
	}
	var file strings.Builder
	env := map[string]string{}
	for _, f := range flags {
		if _, ok := f.Value.(pflag.SliceValue); ok {
			file.WriteString(f.Name + ": []\n")
			continue
		}
		file.WriteString(f.Name + ": '" + f.DefValue + "'\n")
		env[envName(f.Name)] = f.DefValue
	}
	cmd, err := parseServe(t, nil, "--config", writeConfig(t, file.String()))
	if err != nil {
		t.Fatalf("every flag at its default, from a file: %v", err)
	}
	for _, f := range configurable(cmd) {
		if !f.Changed {
			t.Errorf("--%s: not set from the file", f.Name)
		}
	}
	if _, err := parseServe(t, env); err != nil {
		t.Fatalf("every flag at its default, from the environment: %v", err)
	}
}

// TestServeEnvNamesDoNotClash checks that no flag of serve is read from a
// variable that means something else: the client flags' variables, what
// lock and elect give their child, the variables Kubernetes' service links
// would define for Services named tenure, and the tests' own.
func TestServeEnvNamesDoNotClash(t *testing.T) {
	root := NewRootCommand()
	taken := maps.Clone(otherEnv)
	taken[envName(configFlag)] = "names the config file"
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		taken[envName(f.Name)] = "the client flag --" + f.Name
	})
	serve, _, _ := root.Find([]string{"serve"})
	seen := map[string]string{}
	for _, f := range configurable(serve) {
		name := envName(f.Name)
		for t2, why := range taken {
			if name == t2 || strings.HasSuffix(t2, "_") && strings.HasPrefix(name, t2) {
				t.Errorf("--%s: read from %s, which is %s", f.Name, name, why)
			}
		}
		if other, ok := seen[name]; ok {
			t.Errorf("--%s and --%s: both read from %s", f.Name, other, name)
		}
		seen[name] = f.Name
	}
}

func TestSuggestFlag(t *testing.T) {
	flags := []*pflag.Flag{{Name: "listen"}, {Name: "peer-listen"}, {Name: "data-dir"}, {Name: "lease-gc-after"}}
	tests := []struct{ key, want string }{
		{"listne", "listen"},
		{"--listen", "listen"},
		{"Data_Dir", "data-dir"},
		{"peer_listen", "peer-listen"},
		{"gc-after", "lease-gc-after"},
		{"endpoints", ""},
		{"x", ""},
	}
	for _, tt := range tests {
		got := suggestFlag(tt.key, flags)
		want := ""
		if tt.want != "" {
			want = ` (did you mean "` + tt.want + `"?)`
		}
		if got != want {
			t.Errorf("suggestFlag(%q): got = %q, expected: %q", tt.key, got, want)
		}
	}
}

// TestMisspeltEnvVariablesAreWarnedOf: a TENURE_ variable that nothing
// reads gets a warning naming the nearest one tenure does read, for serve
// and the client commands alike; the variables that others set (lock's
// child variables, Kubernetes service links) get none.
func TestMisspeltEnvVariablesAreWarnedOf(t *testing.T) {
	t.Setenv("TENURE_LEASE_GC_AFTR", "1h")
	t.Setenv("TENURE_ENDPOINT", "127.0.0.1:1")
	t.Setenv("TENURE_FROBNICATE", "1")
	t.Setenv("TENURE_LEASE", "default/x")
	t.Setenv("TENURE_PORT_7480_TCP", "tcp://10.0.0.1:7480")
	_, stderr, code := runMain("version")
	if code != ExitOK {
		t.Fatalf("version: exit %d, %s", code, stderr)
	}
	for _, want := range []string{
		"Warning: TENURE_LEASE_GC_AFTR is set, but tenure reads no such variable; it is ignored (did you mean TENURE_LEASE_GC_AFTER?)\n",
		"Warning: TENURE_ENDPOINT is set, but tenure reads no such variable; it is ignored (did you mean TENURE_ENDPOINTS?)\n",
		"Warning: TENURE_FROBNICATE is set, but tenure reads no such variable; it is ignored\n",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr got = %q, expected it to hold %q", stderr, want)
		}
	}
	for _, quiet := range []string{"TENURE_LEASE ", "TENURE_PORT_7480_TCP"} {
		if strings.Contains(stderr, quiet) {
			t.Errorf("stderr got = %q, expected: no warning about %s, which others set", stderr, quiet)
		}
	}
}

func TestKubernetesPrefixFlag(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string // server.Config.KubernetesPrefix
	}{
		{"kube-apiserver's default --etcd-prefix by default", nil, nil, "/registry"},
		{"another apiserver's prefix from the command line", nil, []string{"--kubernetes-prefix", "/k8s"}, "/k8s"},
		{"from the environment", map[string]string{"TENURE_KUBERNETES_PREFIX": "/cluster-a"}, nil, "/cluster-a"},
		{"off from the environment", map[string]string{"TENURE_KUBERNETES_PREFIX": "off"}, nil, ""},
		{"an empty value on the command line is off too", nil, []string{"--kubernetes-prefix="}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, err := parseServe(t, tt.env, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			o := serveOptions{}
			o.kubernetesPrefix, _ = cmd.Flags().GetString("kubernetes-prefix")
			if got := o.kubernetesView(); got != tt.want {
				t.Errorf("KubernetesPrefix: got = %q, expected: %q", got, tt.want)
			}
		})
	}
}

package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
	yaml3 "sigs.k8s.io/yaml/goyaml.v3"
)

// How `tenure serve` takes its settings from a file and the environment.
// Every flag of the command is a key of the file (its name, without the
// dashes: `lease-gc-after: 1h`) and an environment variable
// (TENURE_LEASE_GC_AFTER), found by walking the command's flag set, so a
// flag added later is covered with no change here. A flag takes the first
// of: the command line, the environment, the file, its default.
//
// Only the command's own flags are covered. The persistent flags of the
// client commands already read TENURE_ENDPOINTS, TENURE_CACERT,
// TENURE_CERT, TENURE_KEY and TENURE_TOKEN, and `tenure lock` gives its
// child TENURE_LEASE, TENURE_HOLDER and TENURE_FENCING_TOKEN; serve
// ignores all of these (TestServeEnvNamesDoNotClash keeps it so).

// clientEnv are the variables the client commands' persistent flags read
// (root.go).
var clientEnv = []string{"TENURE_ENDPOINTS", "TENURE_CACERT", "TENURE_CERT", "TENURE_KEY", "TENURE_TOKEN"}

// otherEnv are TENURE_ variables that are neither a serve flag's nor a
// client flag's, and who sets or reads them: envWarnings leaves them
// alone, and no flag of serve may be read from one
// (TestServeEnvNamesDoNotClash). A name ending in '_' is a prefix.
var otherEnv = map[string]string{
	"TENURE_LEASE":            "lock and elect give it to their child",
	"TENURE_HOLDER":           "lock and elect give it to their child",
	"TENURE_FENCING_TOKEN":    "lock and elect give it to their child",
	"TENURE_SERVICE_HOST":     "a Kubernetes service link",
	"TENURE_SERVICE_PORT":     "a Kubernetes service link",
	"TENURE_PORT":             "a Kubernetes service link",
	"TENURE_CLIENT_LOG":       "read by tests",
	"TENURE_TEST_LOG":         "read by tests",
	"TENURE_FAULT_ROUNDS":     "read by tests",
	"TENURE_E2E_MARK":         "read by tests",
	"TENURE_WRITE_SCREENSHOT": "read by tests",
	"TENURE_FIGURES":          "read by the benchmarks",
	"TENURE_FIGURES_KILLS":    "read by the benchmarks",
	"TENURE_BENCH_SYNC_DELAY": "read by a benchsync build's log store (tenure bench --sync-delay)",
	"TENURE_VERSION":          "read by scripts/build.sh",
	"TENURE_COMMIT":           "read by scripts/build.sh",
	"TENURE_COMMIT_TIME":      "read by scripts/build.sh",
	"TENURE_PEERS_PORT":       "a Kubernetes service link",
	"TENURE_PEERS_SERVICE_":   "a Kubernetes service link (prefix)",
	"TENURE_PORT_":            "a Kubernetes service link (prefix)",
	"TENURE_SERVICE_PORT_":    "a Kubernetes service link (prefix)",
}

// envWarnings warns of each TENURE_ variable in environ ("NAME=value")
// that nothing reads: no flag of serve, no client flag, nothing in
// otherEnv. A misspelt variable would otherwise be ignored in silence
// while the same slip in a config file is an error; it is only a
// warning here because the environment is shared with other programs
// and outlives the command that was meant to read it. The nearest name
// tenure reads is suggested.
func envWarnings(root *cobra.Command, environ []string) []string {
	known := slices.Clone(clientEnv)
	known = append(known, envName(configFlag))
	if serve, _, err := root.Find([]string{"serve"}); err == nil && serve != root {
		for _, f := range configurable(serve) {
			known = append(known, envName(f.Name))
		}
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "TENURE_") || slices.Contains(known, name) || otherVar(name) {
			continue
		}
		w := fmt.Sprintf("%s is set, but tenure reads no such variable; it is ignored", name)
		best, bestDist := "", len(name)/3+2
		for _, k := range known {
			if d := editDistance(name, k); d < bestDist {
				best, bestDist = k, d
			}
		}
		if best != "" {
			w += fmt.Sprintf(" (did you mean %s?)", best)
		}
		out = append(out, w)
	}
	return out
}

// otherVar reports whether name is in otherEnv, or under one of its
// prefixes.
func otherVar(name string) bool {
	for k := range otherEnv {
		if name == k || strings.HasSuffix(k, "_") && strings.HasPrefix(name, k) {
			return true
		}
	}
	return false
}

// configFlag names the file; it is the one flag a file cannot set.
const configFlag = "config"

// envName is the environment variable that sets the flag name:
// TENURE_ and the name in upper case with '-' as '_'.
func envName(name string) string {
	return "TENURE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// configurable lists cmd's own flags that the environment and a file
// may set, in name order: all but --config and --help.
func configurable(cmd *cobra.Command) []*pflag.Flag {
	var out []*pflag.Flag
	cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name != configFlag && f.Name != "help" {
			out = append(out, f)
		}
	})
	return out
}

// applyConfig sets every flag of cmd that the command line left alone
// from the environment (looked up with getenv) or, failing that, from
// the YAML file named by --config or TENURE_CONFIG. It runs after cobra
// has parsed the command line and before the command runs, on the
// command's goroutine. It returns what it read, for the log.
//
// An empty environment variable counts as unset, as in most container
// runtimes' handling of `-e NAME=`. A flag set here counts as Changed,
// as if it had been given on the command line.
func applyConfig(cmd *cobra.Command, getenv func(string) string) (settingSources, error) {
	var src settingSources
	flags := configurable(cmd)
	byName := map[string]*pflag.Flag{}
	for _, f := range flags {
		byName[f.Name] = f
	}
	path, _ := cmd.Flags().GetString(configFlag)
	if !cmd.Flags().Changed(configFlag) {
		path = getenv(envName(configFlag))
	}
	var file map[string]any
	if path != "" {
		var err error
		if file, err = readConfigFile(path); err != nil {
			return src, err
		}
		src.File = path
		keys := make([]string, 0, len(file))
		for k := range file {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == configFlag {
				return src, usage("config file %s: key %q: a config file cannot name another; give --config on the command line or in TENURE_CONFIG", path, k)
			}
			if byName[k] == nil {
				return src, usage("config file %s: unknown key %q: tenure serve has no flag --%s%s", path, k, k, suggestFlag(k, flags))
			}
		}
	}
	for _, f := range flags {
		if f.Changed {
			continue // the command line wins
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := f.Value.Set(v); err != nil {
				return src, usage("environment %s=%q: not a valid --%s: %v", envName(f.Name), v, f.Name, err)
			}
			f.Changed = true
			src.Env = append(src.Env, envName(f.Name))
			continue
		}
		v, ok := file[f.Name]
		if !ok {
			continue
		}
		if err := setFromFile(f, v); err != nil {
			return src, usage("config file %s: key %q: %v", path, f.Name, err)
		}
		f.Changed = true
	}
	return src, nil
}

// settingSources says where applyConfig found settings: the config
// file, and the environment variables it used.
type settingSources struct {
	File string
	Env  []string
}

// readConfigFile reads path as a YAML mapping of flag names to values.
// Numbers are kept as written (json.Number), so that a uint64 or a
// value like 0x10 reaches the flag's own parser intact.
func readConfigFile(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usage("config file: %v", err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, usage("config file %s: not valid YAML: %v", path, yamlError(b, err))
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, usage("config file %s: %v", path, err)
	}
	switch d := doc.(type) {
	case nil:
		return map[string]any{}, nil // an empty file, or only comments
	case map[string]any:
		return d, nil
	}
	return nil, usage("config file %s: want a mapping of flag names to values (listen: 127.0.0.1:7480), not a %s", path, yamlKind(doc))
}

// yamlLine is how go-yaml words where it failed.
var yamlLine = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// yamlError is err, YAMLToJSON's failure to read b, with the line the
// mistake is on. YAMLToJSON's go-yaml v2 often names the line after a
// missing ':' and the one before a misplaced '- item'; v3 gets the first
// right, but counts a parser error's line from 0 while counting a
// scanner error's from 1, and its message does not say which it is.
// Reading b up to v3's line tells: if that much parses, the mistake lies
// on the next line.
func yamlError(b []byte, err error) error {
	var doc yaml3.Node
	err3 := yaml3.Unmarshal(b, &doc)
	m := yamlLine.FindStringSubmatch(fmt.Sprint(err3))
	if m == nil {
		return err
	}
	line, _ := strconv.Atoi(m[1])
	lines := bytes.SplitAfter(b, []byte("\n"))
	if line < len(lines) && yaml3.Unmarshal(bytes.Join(lines[:line], nil), &doc) == nil {
		line++
	}
	return fmt.Errorf("line %d: %s", line, m[2])
}

// setFromFile sets f from a value of the config file: a scalar as if
// given on the command line, a list for a flag that takes several.
func setFromFile(f *pflag.Flag, v any) error {
	if list, ok := v.([]any); ok {
		sv, ok := f.Value.(pflag.SliceValue)
		if !ok {
			return fmt.Errorf("a list, but --%s takes one value", f.Name)
		}
		items := make([]string, len(list))
		for i, item := range list {
			s, err := scalar(item)
			if err != nil {
				return fmt.Errorf("item %d: %v", i+1, err)
			}
			items[i] = s
		}
		if err := sv.Replace(items); err != nil {
			return fmt.Errorf("%q is not valid: %v", items, err)
		}
		return nil
	}
	s, err := scalar(v)
	if err != nil {
		return err
	}
	if err := f.Value.Set(s); err != nil {
		return fmt.Errorf("%q is not a valid --%s: %v", s, f.Name, err)
	}
	return nil
}

// scalar is a YAML scalar as the text a flag parses.
func scalar(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return strconv.FormatBool(v), nil
	case nil:
		return "", fmt.Errorf("no value (to keep the default, leave the key out)")
	}
	return "", fmt.Errorf("a %s, where a flag's value belongs", yamlKind(v))
}

func yamlKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "mapping"
	case []any:
		return "list"
	}
	return "scalar"
}

// suggestFlag is ` (did you mean "NAME"?)` for the flag nearest key, or
// "" when none is near enough to be a likely slip.
func suggestFlag(key string, flags []*pflag.Flag) string {
	norm := strings.ToLower(strings.ReplaceAll(strings.TrimLeft(key, "-"), "_", "-"))
	best, bestDist := "", len(norm)/3+2 // near: under a third of it wrong, plus two
	var within []string                 // flags whose name holds the key
	for _, f := range flags {
		if f.Name == norm {
			return fmt.Sprintf(" (did you mean %q?)", f.Name)
		}
		if len(norm) >= 4 && strings.Contains(f.Name, norm) {
			within = append(within, f.Name)
		}
		if d := editDistance(norm, f.Name); d < bestDist {
			best, bestDist = f.Name, d
		}
	}
	if best == "" && len(within) == 1 {
		best = within[0] // gc-after: lease-gc-after
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = slices.Min([]int{prev[j] + 1, cur[j-1] + 1, prev[j-1] + cost})
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

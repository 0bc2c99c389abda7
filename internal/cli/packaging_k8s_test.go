package cli

import (
	"cmp"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

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

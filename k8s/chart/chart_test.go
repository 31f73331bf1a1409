package chart

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// certificate is cert-manager's Certificate (cert-manager.io/v1), the
// fields the chart sets: cert-manager's Go module is too large to import for
// one type, so the strict decode checks against this copy of its schema.
type certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretName  string   `json:"secretName"`
		Duration    string   `json:"duration"`
		RenewBefore string   `json:"renewBefore"`
		CommonName  string   `json:"commonName"`
		Usages      []string `json:"usages"`
		DNSNames    []string `json:"dnsNames"`
		IPAddresses []string `json:"ipAddresses"`
		IssuerRef   struct {
			Name  string `json:"name"`
			Kind  string `json:"kind"`
			Group string `json:"group"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// objects is one rendering, decoded.
type objects struct {
	sts      *appsv1.StatefulSet
	services []*corev1.Service
	cms      []*corev1.ConfigMap
	pdb      *policyv1.PodDisruptionBudget
	sm       *monitoringv1.ServiceMonitor
	rule     *monitoringv1.PrometheusRule
	cert     *certificate
}

// decode decodes every rendered object strictly (unknown or duplicate
// fields fail) into its API type.
func decode(t *testing.T, docs []Doc) objects {
	t.Helper()
	var o objects
	for _, d := range docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(d.YAML, &tm); err != nil {
			t.Fatalf("%s: %v", d.Template, err)
		}
		var into any
		switch tm.APIVersion + "/" + tm.Kind {
		case "apps/v1/StatefulSet":
			if o.sts != nil {
				t.Fatalf("two StatefulSets")
			}
			o.sts = &appsv1.StatefulSet{}
			into = o.sts
		case "v1/Service":
			s := &corev1.Service{}
			o.services = append(o.services, s)
			into = s
		case "v1/ConfigMap":
			c := &corev1.ConfigMap{}
			o.cms = append(o.cms, c)
			into = c
		case "policy/v1/PodDisruptionBudget":
			o.pdb = &policyv1.PodDisruptionBudget{}
			into = o.pdb
		case "monitoring.coreos.com/v1/ServiceMonitor":
			o.sm = &monitoringv1.ServiceMonitor{}
			into = o.sm
		case "monitoring.coreos.com/v1/PrometheusRule":
			o.rule = &monitoringv1.PrometheusRule{}
			into = o.rule
		case "cert-manager.io/v1/Certificate":
			o.cert = &certificate{}
			into = o.cert
		default:
			t.Fatalf("%s: unexpected object %s %s", d.Template, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict(d.YAML, into); err != nil {
			t.Fatalf("%s: strict decode of %s: %v\n%s", d.Template, tm.Kind, err, d.YAML)
		}
	}
	if o.sts == nil {
		t.Fatal("no StatefulSet rendered")
	}
	return o
}

// values is what the test needs from a values combination (chart defaults
// filled in by a second strict decode of the merged values).
type values struct {
	Replicas int
	Ports    struct{ API, Raft int32 }
	TLS      struct {
		Enabled     bool
		SecretName  string `json:"secretName"`
		ClientAuth  string `json:"clientAuth"`
		CertManager struct {
			Enabled bool
		} `json:"certManager"`
	}
	Auth struct {
		Enabled      bool
		SecretName   string `json:"secretName"`
		AuthFileKey  string `json:"authFileKey"`
		PeerTokenKey string `json:"peerTokenKey"`
	}
	Metrics struct {
		ServiceMonitor struct{ Enabled bool } `json:"serviceMonitor"`
		PrometheusRule struct{ Enabled bool } `json:"prometheusRule"`
	}
}

func merged(t *testing.T, overrides []byte) values {
	t.Helper()
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]any{}
	for k, v := range c.Values {
		base[k] = v
	}
	over := map[string]any{}
	if err := yaml.Unmarshal(overrides, &over); err != nil {
		t.Fatal(err)
	}
	b, _ := yaml.Marshal(mergeMaps(base, over))
	var v values
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func mergeMaps(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		am, ok1 := out[k].(map[string]any)
		bm, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			out[k] = mergeMaps(am, bm)
		} else {
			out[k] = v
		}
	}
	return out
}

// TestDocExamplesRender renders every values combination docs/kubernetes.md
// shows, decodes every object strictly and checks the chart's invariants.
func TestDocExamplesRender(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	exs, err := DocExamples()
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range exs {
		t.Run(ex.Name, func(t *testing.T) {
			docs, notes, err := Render(c, "lockd", "locks", ex.Values)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			o := decode(t, docs)
			v := merged(t, ex.Values)
			checkInvariants(t, c.Metadata.AppVersion, o, v)
			if !strings.Contains(notes, "lockd members") {
				t.Errorf("NOTES.txt does not say how to check the members:\n%s", notes)
			}
		})
	}
}

func checkInvariants(t *testing.T, appVersion string, o objects, v values) {
	t.Helper()
	sts := o.sts
	n := int(*sts.Spec.Replicas)
	if n != v.Replicas || n%2 == 0 {
		t.Errorf("replicas %d (values %d): want the values' odd count", n, v.Replicas)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: after a full stop pod 0 cannot be ready alone", sts.Spec.PodManagementPolicy)
	}
	if p := sts.Spec.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenScaled != appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
		t.Errorf("PVCs of scaled-down pods must be deleted (a removed member never restarts on its old data): %+v", p)
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "data" {
		t.Errorf("want one volume claim template named data")
	}
	pod := sts.Spec.Template
	for k, val := range sts.Spec.Selector.MatchLabels {
		if pod.Labels[k] != val {
			t.Errorf("selector %s=%s does not match the pod labels", k, val)
		}
	}
	var ct *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "lockd" {
			ct = &pod.Spec.Containers[i]
		}
	}
	if ct == nil {
		t.Fatal("no lockd container")
	}
	if want := "ghcr.io/lockd-dev/lockd:" + appVersion; ct.Image != want {
		t.Errorf("image %q, want %q", ct.Image, want)
	}
	env := map[string]string{}
	for _, e := range ct.Env {
		env[e.Name] = e.Value
	}
	ports := map[string]int32{}
	for _, p := range ct.Ports {
		ports[p.Name] = p.ContainerPort
	}
	// Ports match the flags start.sh builds (--listen/--raft-listen and the
	// advertised addresses use LOCKD_API_PORT/LOCKD_RAFT_PORT).
	if ports["api"] != v.Ports.API || env["LOCKD_API_PORT"] != fmt.Sprint(v.Ports.API) {
		t.Errorf("api port: container %d, env %s, values %d", ports["api"], env["LOCKD_API_PORT"], v.Ports.API)
	}
	if ports["raft"] != v.Ports.Raft || env["LOCKD_RAFT_PORT"] != fmt.Sprint(v.Ports.Raft) {
		t.Errorf("raft port: container %d, env %s, values %d", ports["raft"], env["LOCKD_RAFT_PORT"], v.Ports.Raft)
	}
	if env["LOCKD_REPLICAS"] != fmt.Sprint(n) || env["LOCKD_STS"] != sts.Name {
		t.Errorf("start.sh env: replicas %q sts %q, want %d %q", env["LOCKD_REPLICAS"], env["LOCKD_STS"], n, sts.Name)
	}
	if e := ct.Env[0]; e.Name != "POD_NAME" || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("POD_NAME must come from metadata.name: %+v", e)
	}
	scheme := "http"
	if v.TLS.Enabled {
		scheme = "https"
	}
	if env["LOCKD_SCHEME"] != scheme {
		t.Errorf("LOCKD_SCHEME %q, want %q", env["LOCKD_SCHEME"], scheme)
	}
	// Probes hit real paths (TestProbePathsAreServed asks a real node).
	for name, p := range map[string]*corev1.Probe{"startup": ct.StartupProbe, "liveness": ct.LivenessProbe, "readiness": ct.ReadinessProbe} {
		if p == nil {
			t.Errorf("no %s probe", name)
			continue
		}
		if v.TLS.ClientAuth == "require" {
			if p.TCPSocket == nil || p.TCPSocket.Port.String() != "api" {
				t.Errorf("%s probe with client certificates required: want tcpSocket on api, got %+v", name, p.ProbeHandler)
			}
			continue
		}
		g := p.HTTPGet
		if g == nil {
			t.Errorf("%s probe is not httpGet", name)
			continue
		}
		want := map[string]string{"startup": "/healthz", "liveness": "/healthz", "readiness": "/readyz"}[name]
		if g.Path != want || g.Port.String() != "api" || !strings.EqualFold(string(g.Scheme), scheme) {
			t.Errorf("%s probe %s %s %s, want %s on api over %s", name, g.Scheme, g.Port.String(), g.Path, want, scheme)
		}
		if !slices.Contains(servedPaths, g.Path) {
			t.Errorf("%s probe path %s is not one lockd serves", name, g.Path)
		}
	}
	// The startup probe waits out a join.
	if sp := ct.StartupProbe; sp != nil && sp.PeriodSeconds*sp.FailureThreshold < 300 {
		t.Errorf("startup probe gives %ds, less than the 5m join timeout", sp.PeriodSeconds*sp.FailureThreshold)
	}
	mounts := map[string]string{}
	for _, m := range ct.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	vols := map[string]corev1.Volume{}
	for _, vol := range pod.Spec.Volumes {
		vols[vol.Name] = vol
	}
	args := strings.Join(ct.Args, " ")
	fileFlag := func(flag, volume, secret string) {
		t.Helper()
		var path string
		for _, a := range ct.Args {
			if p, ok := strings.CutPrefix(a, flag+"="); ok {
				path = p
			}
		}
		if path == "" {
			t.Errorf("no %s flag", flag)
			return
		}
		dir := filepath.Dir(path)
		if mounts[dir] != volume {
			t.Errorf("%s=%s: %s is not the %s volume's mount", flag, path, dir, volume)
		}
		if vol, ok := vols[volume]; !ok || vol.Secret == nil || vol.Secret.SecretName != secret {
			t.Errorf("volume %s: want Secret %s, got %+v", volume, secret, vol)
		}
	}
	if v.TLS.Enabled {
		secret := v.TLS.SecretName
		if secret == "" {
			secret = sts.Name + "-tls"
		}
		for _, f := range []string{"--tls-cert", "--tls-key", "--tls-ca"} {
			fileFlag(f, "tls", secret)
		}
		if strings.Contains(args, "--insecure") {
			t.Errorf("TLS on and --insecure")
		}
		if v.TLS.CertManager.Enabled {
			if o.cert == nil || o.cert.Spec.SecretName != secret {
				t.Errorf("cert-manager: want a Certificate writing Secret %s", secret)
			} else if want := "*." + sts.Spec.ServiceName + ".locks.svc.cluster.local"; !slices.Contains(o.cert.Spec.DNSNames, want) {
				t.Errorf("certificate names %v, want %s (the pods' advertised names)", o.cert.Spec.DNSNames, want)
			}
		} else if o.cert != nil {
			t.Errorf("a Certificate without cert-manager")
		}
	} else if !strings.Contains(args, "--insecure") || strings.Contains(args, "--tls-") {
		t.Errorf("TLS off: want --insecure and no --tls flags: %s", args)
	}
	if v.Auth.Enabled {
		fileFlag("--auth-file", "auth", v.Auth.SecretName)
		fileFlag("--peer-token-file", "auth", v.Auth.SecretName)
		if !strings.Contains(env["LOCKD_PROBE_ARGS"], "--token-file=") {
			t.Errorf("auth on: the bootstrap probe needs the peer token: %q", env["LOCKD_PROBE_ARGS"])
		}
	} else if strings.Contains(args, "--auth-file") {
		t.Errorf("auth off but --auth-file")
	}
	if !strings.Contains(args, "--allowed-hosts="+sts.Name+","+sts.Name+".locks,") {
		t.Errorf("--allowed-hosts must name the client service: %s", args)
	}
	// Services: the headless one names the pods, the client one reaches the API.
	var headless, client *corev1.Service
	for _, s := range o.services {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless = s
		} else {
			client = s
		}
		for _, p := range s.Spec.Ports {
			if ports[p.TargetPort.String()] != p.Port {
				t.Errorf("service %s port %s: %d -> %s, container has %d", s.Name, p.Name, p.Port, p.TargetPort.String(), ports[p.TargetPort.String()])
			}
		}
		for k, val := range s.Spec.Selector {
			if pod.Labels[k] != val {
				t.Errorf("service %s selector %s=%s does not match the pods", s.Name, k, val)
			}
		}
	}
	if headless == nil || headless.Name != sts.Spec.ServiceName || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("want a headless service %s publishing not-ready pods", sts.Spec.ServiceName)
	}
	if client == nil || client.Name != sts.Name {
		t.Errorf("want a client service named %s", sts.Name)
	}
	if want := sts.Spec.ServiceName + ".locks.svc.cluster.local"; env["LOCKD_DOMAIN"] != want {
		t.Errorf("LOCKD_DOMAIN %q, want %q", env["LOCKD_DOMAIN"], want)
	}
	// The PDB keeps a majority.
	if n > 1 {
		if o.pdb == nil || o.pdb.Spec.MinAvailable == nil {
			t.Fatalf("no PodDisruptionBudget with minAvailable")
		}
		m := o.pdb.Spec.MinAvailable.IntValue()
		if m != n/2+1 {
			t.Errorf("PDB minAvailable %d of %d, want the majority %d", m, n, n/2+1)
		}
		for k, val := range o.pdb.Spec.Selector.MatchLabels {
			if pod.Labels[k] != val {
				t.Errorf("PDB selector %s=%s does not match the pods", k, val)
			}
		}
	}
	// Monitoring.
	if (o.sm != nil) != v.Metrics.ServiceMonitor.Enabled || (o.rule != nil) != v.Metrics.PrometheusRule.Enabled {
		t.Errorf("ServiceMonitor %v PrometheusRule %v, values %+v", o.sm != nil, o.rule != nil, v.Metrics)
	}
	if o.sm != nil {
		ep := o.sm.Spec.Endpoints[0]
		if ep.Port != "api" || ep.Path != "/metrics" || string(*ep.Scheme) != scheme {
			t.Errorf("ServiceMonitor endpoint %s %s %v", ep.Port, ep.Path, ep.Scheme)
		}
		// Exactly one service: two would scrape every member twice and
		// double the alert rules' sums.
		var matched []string
		for _, s := range o.services {
			all := true
			for k, val := range o.sm.Spec.Selector.MatchLabels {
				all = all && s.Labels[k] == val
			}
			if all {
				matched = append(matched, s.Name)
			}
		}
		if len(matched) != 1 || matched[0] != headless.Name {
			t.Errorf("ServiceMonitor selects services %v, want only %s", matched, headless.Name)
		}
	}
	if o.rule != nil {
		checkRules(t, o.rule)
	}
	// The start script is the chart's file.
	script, err := os.ReadFile(filepath.Join(RepoRoot(), "deploy", "helm", "lockd", "files", "start.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.cms) != 1 || strings.TrimSpace(o.cms[0].Data["start.sh"]) != strings.TrimSpace(string(script)) {
		t.Errorf("the ConfigMap does not carry files/start.sh")
	}
}

// servedPaths are the probe paths lockd serves (internal/api/http.go);
// TestProbePathsAreServed checks them on a real node.
var servedPaths = []string{"/healthz", "/readyz"}

// checkRules: the PrometheusRule carries deploy/prometheus/lockd-alerts.yml.
func checkRules(t *testing.T, r *monitoringv1.PrometheusRule) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "deploy", "prometheus", "lockd-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(b, &want); err != nil {
		t.Fatalf("deploy/prometheus/lockd-alerts.yml: %v", err)
	}
	got, _ := yaml.Marshal(r.Spec)
	exp, _ := yaml.Marshal(want)
	if !bytes.Equal(got, exp) {
		t.Errorf("PrometheusRule differs from deploy/prometheus/lockd-alerts.yml (copy it to deploy/helm/lockd/files/)")
	}
	if len(want.Groups) == 0 || len(want.Groups[0].Rules) == 0 {
		t.Errorf("no alert rules")
	}
}

// TestRefusedValues: values that cannot make a safe cluster fail to render
// with a message saying why.
func TestRefusedValues(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	for vals, want := range map[string]string{
		"replicas: 4":          "replicas must be odd",
		"replicas: 0":          "replicas must be odd",
		"tls: {enabled: true}": "tls.enabled needs tls.secretName",
		"tls: {enabled: true, secretName: x, clientAuth: maybe}": "tls.clientAuth must be",
		"tls: {enabled: true, certManager: {enabled: true}}":     "issuerRef.name",
		"auth: {enabled: true}":                                  "auth.enabled needs auth.secretName",
	} {
		_, _, err := Render(c, "lockd", "locks", []byte(vals))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error containing %q", vals, err, want)
		}
	}
}

// TestAlertsCopyMatches: the chart's copy of the alert rules is the file
// deploy/ tests.
func TestAlertsCopyMatches(t *testing.T) {
	a, err := os.ReadFile(filepath.Join(RepoRoot(), "deploy", "prometheus", "lockd-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "deploy", "helm", "lockd", "files", "lockd-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("deploy/helm/lockd/files/lockd-alerts.yml differs from deploy/prometheus/lockd-alerts.yml: copy it")
	}
}

package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/k8s/internal/proc"
)

// pod is one StatefulSet pod played by a real lockd process: the chart's
// rendered start.sh, its rendered args and env, and a test-provided
// resolver (LOCKD_PEERS) mapping lockd-N to 127.0.0.1 ports.
type pod struct {
	name, api, raft, dir string
	cmd                  *exec.Cmd
	log                  string
}

type podSet struct {
	t       *testing.T
	lockd   string
	script  string
	args    []string
	env     []string
	peers   string
	pods    []*pod
	logsDir string
	cli     []string // TLS and token flags for the test's own `lockd members`
}

// newPodSet renders the chart with values; mounts maps the pod's mount
// directories (/etc/lockd/tls/, /etc/lockd/auth/) to the test's files.
func newPodSet(t *testing.T, values string, mounts map[string]string) *podSet {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	docs, _, err := Render(c, "lockd", "locks", []byte(values))
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, docs)
	ps := &podSet{t: t, lockd: proc.Build(t, "repo", "./cmd/lockd"), logsDir: t.TempDir()}
	ps.script = filepath.Join(t.TempDir(), "start.sh")
	if err := os.WriteFile(ps.script, []byte(o.cms[0].Data["start.sh"]), 0o755); err != nil {
		t.Fatal(err)
	}
	ct := o.sts.Spec.Template.Spec.Containers[0]
	remap := func(s string) string {
		for from, to := range mounts {
			s = strings.ReplaceAll(s, from, to)
		}
		return s
	}
	for _, a := range ct.Args {
		ps.args = append(ps.args, remap(a))
	}
	for _, e := range ct.Env {
		if e.ValueFrom == nil {
			ps.env = append(ps.env, e.Name+"="+remap(e.Value))
		}
	}
	var peers []string
	for i := range int(*o.sts.Spec.Replicas) {
		p := &pod{
			name: fmt.Sprintf("%s-%d", o.sts.Name, i),
			api:  fmt.Sprintf("127.0.0.1:%d", proc.FreePort(t)),
			raft: fmt.Sprintf("127.0.0.1:%d", proc.FreePort(t)),
			dir:  filepath.Join(t.TempDir(), "data"),
		}
		p.log = filepath.Join(ps.logsDir, p.name+".log")
		ps.pods = append(ps.pods, p)
		peers = append(peers, p.api+","+p.raft)
	}
	ps.peers = strings.Join(peers, " ")
	return ps
}

// start runs pod i's start script as the container would (the rendered
// command's script and args), with the addresses mapped to 127.0.0.1.
func (ps *podSet) start(i int) {
	p := ps.pods[i]
	cmd := exec.Command("sh", append([]string{ps.script}, ps.args...)...)
	cmd.Env = append(os.Environ(), ps.env...)
	cmd.Env = append(cmd.Env,
		"POD_NAME="+p.name,
		"LOCKD_PEERS="+ps.peers,
		"LOCKD_LISTEN="+p.api,
		"LOCKD_RAFT_LISTEN="+p.raft,
		"LOCKD_DATA_DIR="+p.dir,
		"LOCKD_BIN="+ps.lockd,
	)
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		ps.t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		ps.t.Fatal(err)
	}
	p.cmd = cmd
	ps.t.Cleanup(func() { ps.kill(i) })
}

func (ps *podSet) kill(i int) {
	if c := ps.pods[i].cmd; c != nil && c.Process != nil {
		_ = c.Process.Kill() // start.sh execs lockd: this is lockd
		_ = c.Wait()
		ps.pods[i].cmd = nil
	}
}

func (ps *podSet) logOf(i int) string {
	b, _ := os.ReadFile(ps.pods[i].log)
	return string(b)
}

func (ps *podSet) scheme() string {
	if slices.Contains(ps.env, "LOCKD_SCHEME=https") {
		return "https"
	}
	return "http"
}

// waitReady polls the pod's /readyz with the real CLI until it answers.
func (ps *podSet) waitReady(i int) {
	ps.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, err := exec.Command(ps.lockd, append([]string{"status", "--endpoints", ps.scheme() + "://" + ps.pods[i].api}, ps.cli...)...).Output()
		if err == nil {
			if ps.scheme() == "http" {
				if err = proc.WaitHTTP("http://"+ps.pods[i].api+"/readyz", time.Second); err == nil {
					return
				}
			} else {
				return
			}
		}
		if time.Now().After(deadline) {
			ps.t.Fatalf("%s not up within 90s: %v\n%s", ps.pods[i].name, err, ps.logOf(i))
		}
		time.Sleep(200 * time.Millisecond) // polling a real process, bounded by the deadline
	}
}

type membersOut struct {
	ClusterID string `json:"clusterId"`
	Members   []struct {
		ID    string `json:"id"`
		Voter bool   `json:"voter"`
	} `json:"members"`
}

// members asks the cluster (through every pod's address) with the real CLI.
func (ps *podSet) members() (membersOut, error) {
	var eps []string
	for _, p := range ps.pods {
		eps = append(eps, ps.scheme()+"://"+p.api)
	}
	out, err := exec.Command(ps.lockd, append([]string{"members", "--json", "--endpoints", strings.Join(eps, ",")}, ps.cli...)...).Output()
	if err != nil {
		return membersOut{}, fmt.Errorf("lockd members: %w", err)
	}
	var m membersOut
	return m, json.Unmarshal(out, &m)
}

// waitVoters polls until the members are exactly the pods, all voters.
func (ps *podSet) waitVoters() membersOut {
	ps.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		m, err := ps.members()
		// The cluster id too: a node that has just restarted lists the
		// Raft configuration before it has replayed the entry that holds
		// the id.
		ok := err == nil && len(m.Members) == len(ps.pods) && m.ClusterID != ""
		for _, mb := range m.Members {
			ok = ok && mb.Voter && strings.HasPrefix(mb.ID, "lockd-")
		}
		if ok {
			return m
		}
		if time.Now().After(deadline) {
			ps.t.Fatalf("members not %d voters within 90s: %+v %v", len(ps.pods), m, err)
		}
		time.Sleep(200 * time.Millisecond) // polling real processes, bounded by the deadline
	}
}

// TestStartScriptRealCluster runs the chart's start script with real lockd
// processes named as the StatefulSet names them: all three pods start at
// once (podManagementPolicy Parallel) and form one cluster (lockd-0
// bootstraps, the others join); a restarted pod resumes on its data; pod 0
// back with an empty disk joins the running cluster instead of
// bootstrapping a second one.
func TestStartScriptRealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts lockd processes")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	t.Run("plain", func(t *testing.T) {
		startScriptScenario(t, newPodSet(t, "replicas: 3", nil))
	})
	// TLS from a Secret and the auth file from a Secret: the files the
	// chart mounts, made with lockd's own tools.
	t.Run("tls-auth", func(t *testing.T) {
		lockdBin := proc.Build(t, "repo", "./cmd/lockd")
		tlsDir, authDir := t.TempDir(), t.TempDir()
		sh := func(dir, script string) {
			cmd := exec.Command("sh", "-ec", script)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "LOCKD="+lockdBin)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", script, err, out)
			}
		}
		sh(tlsDir, `"$LOCKD" cert ca --dir . && "$LOCKD" cert node lockd --dir . && mv lockd.crt tls.crt && mv lockd.key tls.key`)
		sh(authDir, `"$LOCKD" token --out peer.token --grant peer node > auth.txt && "$LOCKD" token --out ops.token --grant admin ops >> auth.txt`)
		ps := newPodSet(t, "tls: {enabled: true, secretName: lockd-tls}\nauth: {enabled: true, secretName: lockd-auth}",
			map[string]string{"/etc/lockd/tls/": tlsDir + "/", "/etc/lockd/auth/": authDir + "/"})
		ps.cli = []string{"--ca", filepath.Join(tlsDir, "ca.crt"), "--token-file", filepath.Join(authDir, "ops.token")}
		startScriptScenario(t, ps)
	})
}

func startScriptScenario(t *testing.T, ps *podSet) {
	for i := range ps.pods {
		ps.start(i)
	}
	for i := range ps.pods {
		ps.waitReady(i)
	}
	first := ps.waitVoters()
	if !strings.Contains(ps.logOf(0), "bootstraps a new cluster") {
		t.Errorf("lockd-0 did not bootstrap:\n%s", ps.logOf(0))
	}
	for i := 1; i < len(ps.pods); i++ {
		if l := ps.logOf(i); !strings.Contains(l, "joins via") || strings.Contains(l, "bootstrap") {
			t.Errorf("%s did not join:\n%s", ps.pods[i].name, l)
		}
	}

	// A restarted pod keeps its data and rejoins as the same member.
	ps.kill(1)
	ps.start(1)
	ps.waitReady(1)
	if !strings.Contains(ps.logOf(1), "lockd-1 resumes") {
		t.Errorf("lockd-1 did not resume from its data:\n%s", ps.logOf(1))
	}
	if m := ps.waitVoters(); m.ClusterID != first.ClusterID {
		t.Fatalf("cluster id %s after a restart, was %s", m.ClusterID, first.ClusterID)
	}

	// Pod 0 loses its disk: it must join, not bootstrap a second cluster.
	ps.kill(0)
	if err := os.RemoveAll(ps.pods[0].dir); err != nil {
		t.Fatal(err)
	}
	ps.start(0)
	ps.waitReady(0)
	if !strings.Contains(ps.logOf(0), "a cluster answers: joining it") {
		t.Errorf("lockd-0 with an empty disk did not join:\n%s", ps.logOf(0))
	}
	if m := ps.waitVoters(); m.ClusterID != first.ClusterID {
		t.Fatalf("lockd-0 made cluster %s, want the running %s", m.ClusterID, first.ClusterID)
	}
}

// TestStartScriptRefusesBadPodName: a pod name that is not <sts>-<ordinal>
// stops the script with a message (never a bootstrap under a wrong name).
func TestStartScriptRefusesBadPodName(t *testing.T) {
	ps := newPodSet(t, "replicas: 3", nil)
	for _, name := range []string{"lockd", "other-0", "lockd-x"} {
		cmd := exec.Command("sh", ps.script)
		cmd.Env = append(append(os.Environ(), ps.env...), "POD_NAME="+name, "LOCKD_DATA_DIR="+t.TempDir(), "LOCKD_BIN=/bin/false")
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 64 || !strings.Contains(string(out), "start.sh: pod name") {
			t.Errorf("POD_NAME=%s: %v %s", name, err, out)
		}
	}
}

// TestProbePathsAreServed asks a real lockd node for the probe paths the
// chart uses.
func TestProbePathsAreServed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a lockd process")
	}
	nodes := proc.Cluster(t, proc.Build(t, "repo", "./cmd/lockd"), 1)
	for _, p := range servedPaths {
		if err := proc.WaitHTTP(nodes[0].URL()+p, 30*time.Second); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
}

func newPodSet(t *testing.T, values string) *podSet {
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
	ps.args = ct.Args
	for _, e := range ct.Env {
		if e.ValueFrom == nil {
			ps.env = append(ps.env, e.Name+"="+e.Value)
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

func (ps *podSet) waitReady(i int) {
	ps.t.Helper()
	if err := proc.WaitHTTP("http://"+ps.pods[i].api+"/readyz", 90*time.Second); err != nil {
		ps.t.Fatalf("%s: %v\n%s", ps.pods[i].name, err, ps.logOf(i))
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
		eps = append(eps, "http://"+p.api)
	}
	out, err := exec.Command(ps.lockd, "members", "--json", "--endpoints", strings.Join(eps, ",")).Output()
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
		ok := err == nil && len(m.Members) == len(ps.pods)
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
	ps := newPodSet(t, "replicas: 3")
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
	ps := newPodSet(t, "replicas: 3")
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

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tlsNode is a `lockd serve` process with TLS, as in
// docs/security-tls.md.
type tlsNode struct {
	id, api, raft string
	srv           *lockdServer
}

// startTLSNode starts `lockd serve` with the walkthrough's flags and waits
// until /healthz answers over TLS.
func startTLSNode(t *testing.T, hc *http.Client, pki, dir, id, join string) *tlsNode {
	t.Helper()
	n := &tlsNode{id: id, api: freePort(t), raft: freePort(t)}
	s := &lockdServer{url: "https://" + n.api, log: filepath.Join(dir, id+".log"), exited: make(chan struct{})}
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := []string{"serve", "--node-id", id, "--data-dir", filepath.Join(dir, id),
		"--listen", n.api, "--raft-listen", n.raft,
		"--tls-cert", filepath.Join(pki, id+".crt"), "--tls-key", filepath.Join(pki, id+".key"),
		"--tls-ca", filepath.Join(pki, "ca.crt"), "--tls-client-auth", "require",
		"--heartbeat-timeout", "300ms", "--election-timeout", "300ms"}
	if join != "" {
		args = append(args, "--join", join)
	}
	s.cmd = exec.Command(lockdBin, args...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
		if t.Failed() {
			b, _ := os.ReadFile(s.log)
			t.Logf("%s log:\n%s", id, b)
		}
	})
	n.srv = s
	if !poll(20*time.Second, func() bool {
		select {
		case <-s.exited:
			return true
		default:
		}
		resp, err := hc.Get(s.url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}) {
		t.Fatalf("%s not serving after 20s", id)
	}
	select {
	case <-s.exited:
		b, _ := os.ReadFile(s.log)
		t.Fatalf("%s exited: %s", id, b)
	default:
	}
	return n
}

// tlsCLI runs `lockd ARGS...` in dir ("" for the test's) with env added,
// bounded in time, and returns stdout, stderr and the exit status.
func tlsCLI(t *testing.T, dir string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, lockdBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("lockd %s still running after 30s", strings.Join(args, " "))
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	}
	t.Fatalf("lockd %s: %v", strings.Join(args, " "), err)
	return "", "", -1
}

// TestSecureClusterWalkthrough (issue 10, acceptance 3 and the walkthrough
// of docs/security-tls.md, step by step with the built binary): lockd cert
// makes a CA, three node certificates and a client certificate; three
// nodes with TLS and required client certificates form a cluster through
// joins; a client with the certificate lists the members and holds a lock
// through a follower (`lockd run`), a client without one is refused with
// the TLS cause; the leader is killed and the others serve; a node
// certificate renewed on disk is served after SIGHUP, without a restart.
func TestSecureClusterWalkthrough(t *testing.T) {
	needBinary(t)
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	for _, args := range [][]string{
		{"cert", "ca", "--dir", "pki"},
		{"cert", "node", "n1", "--dir", "pki"},
		{"cert", "node", "n2", "--dir", "pki"},
		{"cert", "node", "n3", "--dir", "pki"},
		{"cert", "client", "alice", "--dir", "pki"},
	} {
		if out, errOut, code := tlsCLI(t, dir, nil, args...); code != 0 {
			t.Fatalf("lockd %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	if _, errOut, code := tlsCLI(t, dir, nil, "cert", "node", "n1", "--dir", "pki"); code == 0 || !strings.Contains(errOut, "exists") {
		t.Errorf("lockd cert over an existing file: exit %d, %s", code, errOut)
	}

	roots := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(caPEM)
	alice, err := tls.LoadX509KeyPair(filepath.Join(pki, "alice.crt"), filepath.Join(pki, "alice.key"))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{alice}}}}
	defer hc.CloseIdleConnections()

	n1 := startTLSNode(t, hc, pki, dir, "n1", "")
	n2 := startTLSNode(t, hc, pki, dir, "n2", n1.api)
	n3 := startTLSNode(t, hc, pki, dir, "n3", n1.api)
	nodes := []*tlsNode{n1, n2, n3}

	env := []string{"LOCKD_CA=pki/ca.crt", "LOCKD_CERT=pki/alice.crt", "LOCKD_KEY=pki/alice.key",
		"LOCKD_ENDPOINTS=" + n1.api + "," + n2.api + "," + n3.api}
	type member struct {
		ID, API, Role string
		Voter         bool
	}
	var members struct{ Members []member }
	if !poll(20*time.Second, func() bool {
		out, _, code := tlsCLI(t, dir, env, "members", "--json")
		if code != 0 || json.Unmarshal([]byte(out), &members) != nil || len(members.Members) != 3 {
			return false
		}
		for _, m := range members.Members {
			if !m.Voter || !strings.HasPrefix(m.API, "https://") {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("no three https voters: %+v", members)
	}
	leader := ""
	for _, m := range members.Members {
		if m.Role == "leader" {
			leader = m.ID
		}
	}
	follower := n2
	if leader == "n2" {
		follower = n3
	}
	out, errOut, code := tlsCLI(t, dir, env, "run", "--endpoints", follower.api, "--wait", "10s", "jobs/nightly", "--", "sh", "-c", "echo held $LOCKD_TOKEN")
	if code != 0 || !strings.HasPrefix(out, "held ") {
		t.Fatalf("lockd run through follower %s: exit %d: %s%s", follower.id, code, out, errOut)
	}
	_, errOut, code = tlsCLI(t, dir, []string{"LOCKD_CA=pki/ca.crt"}, "status", "--endpoints", follower.api)
	if code != exitUnavailable || !strings.Contains(errOut, "certificate required") {
		t.Errorf("status without a client certificate: exit %d: %s", code, errOut)
	}
	if _, errOut, code = tlsCLI(t, dir, nil, "status", "--endpoints", follower.api, "--ca", "pki/ca.crt", "--cert", "pki/alice.crt", "--key", "pki/alice.key"); code != 0 {
		t.Errorf("status with --ca, --cert, --key: exit %d: %s", code, errOut)
	}
	out, errOut, code = tlsCLI(t, dir, env, "bench", "--endpoints", follower.api, "--clients", "2", "--duration", "500ms", "--warmup", "0s", "--json")
	var report struct{ Ops int64 }
	if code != 0 || json.Unmarshal([]byte(out), &report) != nil || report.Ops == 0 {
		t.Errorf("bench over tls: exit %d, %+v: %s%s", code, report, out, errOut)
	}
	if _, errOut, code = tlsCLI(t, dir, env, "status", "--endpoints", "http://"+follower.api); code == 0 {
		t.Errorf("status over plaintext to a tls node: exit 0: %s", errOut)
	}

	// Fail over: kill the leader; the two others elect one over mutual TLS.
	var survivors []string
	for _, n := range nodes {
		if n.id == leader {
			if err := n.srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-n.srv.exited
		} else {
			survivors = append(survivors, n.api)
		}
	}
	out, errOut, code = tlsCLI(t, dir, env, "run", "--endpoints", strings.Join(survivors, ","), "--wait", "20s", "jobs/nightly", "--", "echo", "again")
	if code != 0 || out != "again\n" {
		t.Fatalf("lockd run after the leader was killed: exit %d: %s%s", code, out, errOut)
	}

	// Renew the follower's certificate the way the walkthrough says: make
	// it elsewhere, move it into place, send SIGHUP.
	served := func() *x509.Certificate {
		c, err := tls.Dial("tcp", follower.api, &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{alice}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	before := served()
	if _, errOut, code := tlsCLI(t, dir, nil, "cert", "node", follower.id, "--dir", "renew", "--ca-cert", "pki/ca.crt", "--ca-key", "pki/ca.key"); code != 0 {
		t.Fatalf("lockd cert into renew/: %s", errOut)
	}
	for _, ext := range []string{".crt", ".key"} {
		if err := os.Rename(filepath.Join(dir, "renew", follower.id+ext), filepath.Join(pki, follower.id+ext)); err != nil {
			t.Fatal(err)
		}
	}
	if err := follower.srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !poll(5*time.Second, func() bool { return !served().Equal(before) }) {
		t.Fatal("the renewed certificate is not served")
	}
	if _, errOut, code := tlsCLI(t, dir, env, "status", "--endpoints", follower.api); code != 0 {
		t.Errorf("status after the renewal: exit %d: %s", code, errOut)
	}
}

// TestServeRefusesPlaintextNonLoopback (issue 10): `lockd serve` on a
// wildcard address without TLS exits 64 before it listens, saying why,
// unless --insecure; loopback with no flags is the quick start (the other
// e2e tests).
func TestServeRefusesPlaintextNonLoopback(t *testing.T) {
	needBinary(t)
	code, stderr, _ := serveOnce(t, "--data-dir", filepath.Join(t.TempDir(), "d"),
		"--listen", "0.0.0.0:0", "--advertise", "http://10.1.2.3:7070", "--raft-listen", freePort(t))
	if code != exitUsage {
		t.Fatalf("exit %d, want %d: %s", code, exitUsage, stderr)
	}
	wantOneLine(t, stderr, `listen "0.0.0.0:0" is not a loopback address`, "--insecure")
}

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPeerTokenCluster: nodes without TLS authenticate to each other with
// a peer token (docs/security.md, *Forwarded calls*), the other way than
// the member certificates of TestSecureClusterWalkthrough. Tokens made by
// `lockd token`; three processes that join and are polled for catch-up
// with their peer token and forward with it, keeping the caller's
// identity; a client token limited to billing/; the CLI with
// --token-file; the audit log, which never carries a token.
func TestPeerTokenCluster(t *testing.T) {
	needBinary(t)
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	var auth strings.Builder
	for _, tok := range [][]string{
		{"ops.token", "admin", "ops"},
		{"node.token", "peer", "node"},
		{"billing.token", "lock:billing/", "billing-app"},
	} {
		out, errOut, code := lockdCLI(t, "", "token", "--out", file(tok[0]), "--grant", tok[1], tok[2])
		if code != 0 {
			t.Fatalf("lockd token %v: exit %d: %s", tok, code, errOut)
		}
		auth.WriteString(out)
	}
	if err := os.WriteFile(file("auth.txt"), []byte(auth.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var nodes []*lockdServer
	for i, id := range []string{"n1", "n2", "n3"} {
		args := []string{"--node-id", id, "--auth-file", file("auth.txt"), "--peer-token-file", file("node.token"),
			"--audit-log", file(id + ".audit")}
		ready := "/readyz"
		if i > 0 {
			args = append(args, "--join", nodes[0].url)
			ready = "/healthz"
		}
		nodes = append(nodes, startNode(t, filepath.Join(dir, id), freePort(t), freePort(t), ready, args...))
	}
	all := nodes[0].url + "," + nodes[1].url + "," + nodes[2].url
	voters := func() bool {
		out, _, code := lockdCLI(t, all, "members", "--token-file", file("ops.token"))
		return code == 0 && strings.Count(out, " yes ") == 3
	}
	if !pollEvery(30*time.Second, 200*time.Millisecond, voters) {
		out, errOut, _ := lockdCLI(t, all, "members", "--token-file", file("ops.token"))
		t.Fatalf("no 3 voters:\n%s%s", out, errOut)
	}
	// Through a follower only: calls are forwarded with the caller's
	// identity. n1 bootstrapped, so it leads unless an election moved it.
	follower := nodes[2].url
	if _, errOut, code := lockdCLI(t, follower, "run", "--token-file", file("billing.token"), "billing/job", "--", "true"); code != 0 {
		t.Fatalf("lockd run billing/job via a follower: exit %d: %s", code, errOut)
	}
	_, errOut, code := lockdCLI(t, follower, "run", "--token-file", file("billing.token"), "payments/job", "--", "true")
	if code == 0 || !strings.Contains(errOut, "permission denied") {
		t.Fatalf("lockd run payments/job with billing's token: exit %d: %s", code, errOut)
	}
	_, errOut, code = lockdCLI(t, all, "ls")
	if code == 0 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("lockd ls without a token: exit %d: %s", code, errOut)
	}
	if out, errOut, code := lockdCLI(t, all, "ls", "--token-file", file("ops.token")); code != 0 {
		t.Fatalf("lockd ls as ops: exit %d: %s%s", code, out, errOut)
	}
	// A node with a token that is not a peer's cannot join: the join is
	// refused and the node gives up.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, lockdBin, "serve", "--node-id", "n4", "--data-dir", file("n4"),
		"--listen", freePort(t), "--raft-listen", freePort(t), "--auth-file", file("auth.txt"),
		"--peer-token-file", file("billing.token"), "--join", nodes[0].url, "--join-timeout", "3s").CombinedOutput()
	if ctx.Err() != nil || err == nil || !strings.Contains(string(out), "may not Join") {
		t.Fatalf("n4 joining with billing's token: %v, %v:\n%s", ctx.Err(), err, out)
	}
	if out, _, _ := lockdCLI(t, all, "members", "--token-file", file("ops.token")); strings.Contains(out, "n4") {
		t.Fatalf("n4 became a member:\n%s", out)
	}
	var audit string
	for _, id := range []string{"n1", "n2", "n3"} {
		b, _ := os.ReadFile(file(id + ".audit"))
		audit += string(b)
	}
	if !strings.Contains(audit, `"identity":"billing-app"`) || !strings.Contains(audit, `"lock":"payments/job","outcome":"refused"`) {
		t.Fatalf("audit logs lack the refusal:\n%s", audit)
	}
	for _, tok := range []string{"ops.token", "node.token", "billing.token"} {
		b, _ := os.ReadFile(file(tok))
		if strings.Contains(audit, strings.TrimSpace(string(b))) {
			t.Fatalf("audit log carries %s", tok)
		}
	}
}

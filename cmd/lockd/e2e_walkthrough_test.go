package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/internal/fsm"
)

// walkthroughDoc is the page whose walkthrough TestSecureClusterWalkthrough
// runs.
const walkthroughDoc = "../../docs/secure-cluster.md"

// walkthroughSteps returns the shell steps of the doc's "## Walkthrough"
// section: every line of its sh blocks, with backslash continuations kept
// with their line, without blank lines and comments.
func walkthroughSteps(t *testing.T, doc string) []string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	in, block, cont := false, false, ""
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !block && strings.HasPrefix(line, "## "):
			in = line == "## Walkthrough"
		case in && !block && line == "```sh":
			block = true
		case block && line == "```":
			block = false
		case block:
			if cont != "" {
				line = cont + "\n" + line
				cont = ""
			}
			if strings.HasSuffix(line, "\\") {
				cont = line
				continue
			}
			if s := strings.TrimSpace(line); s != "" && !strings.HasPrefix(s, "#") {
				steps = append(steps, line)
			}
		}
	}
	if len(steps) == 0 {
		t.Fatalf("%s: no sh blocks under ## Walkthrough", doc)
	}
	return steps
}

// docShell is one `sh` that runs a doc's steps in order, keeping its
// variables, exports and background jobs between steps, as a reader's
// terminal would. It runs in its own process group, which its background
// jobs (the lockd serve nodes) share; Cleanup kills the group.
type docShell struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	dir   string // the working directory
	steps string // where each step's output and status go
	n     int
}

func startDocShell(t *testing.T, dir string) *docShell {
	t.Helper()
	s := &docShell{t: t, dir: dir, steps: t.TempDir()}
	s.cmd = exec.Command("sh")
	s.cmd.Dir = dir
	env := []string{"PATH=" + filepath.Dir(lockdBin) + string(os.PathListSeparator) + os.Getenv("PATH")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LOCKD_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	s.cmd.Env = env
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	log, err := os.Create(filepath.Join(s.steps, "sh.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if s.in, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.in.Close()
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		_ = s.cmd.Wait()
		// The nodes were in the group too; wait until they are gone.
		for _, f := range []string{"n1.pid", "n2.pid", "n3.pid"} {
			if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					poll(5*time.Second, func() bool { return gone(pid) })
				}
			}
		}
	})
	return s
}

// run runs one step (stdin from /dev/null, so it cannot read the steps
// that follow) and returns its stdout, stderr and exit status.
func (s *docShell) run(step string, timeout time.Duration) (string, string, int) {
	s.t.Helper()
	s.n++
	p := filepath.Join(s.steps, strconv.Itoa(s.n))
	if _, err := fmt.Fprintf(s.in, "{\n%s\n} >%s.out 2>%s.err </dev/null; echo $? >%s.tmp; mv %s.tmp %s.rc\n", step, p, p, p, p, p); err != nil {
		s.t.Fatalf("step %q: %v", step, err)
	}
	var rc []byte
	if !poll(timeout, func() bool {
		b, err := os.ReadFile(p + ".rc")
		rc = b
		return err == nil
	}) {
		s.t.Fatalf("step %q: not done after %v", step, timeout)
	}
	out, _ := os.ReadFile(p + ".out")
	errOut, _ := os.ReadFile(p + ".err")
	code, err := strconv.Atoi(strings.TrimSpace(string(rc)))
	if err != nil {
		s.t.Fatalf("step %q: status %q", step, rc)
	}
	return string(out), string(errOut), code
}

// gone reports whether process pid has exited: it no longer exists, or
// it is a zombie its parent (the doc's sh) has not reaped yet.
func gone(pid int) bool {
	if !alive(pid) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state …; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}

// docPort matches the walkthrough's addresses, replaced by free ports.
var docPort = regexp.MustCompile(`127\.0\.0\.1:7[01]0[1-3]\b`)

// TestSecureClusterWalkthrough runs the walkthrough of
// docs/secure-cluster.md as written, step by step in one sh, with the
// built binary and free ports: lockd cert makes a CA, node and client
// certificates; lockd token the auth file; three nodes with peer mutual
// TLS and --auth-file form a cluster through joins; a client with a
// certificate and tokens takes a billing/ lock, is refused payments/, reads
// with a read-only token and is refused a lock with it, saves a backup as
// admin; a client without a certificate is refused the handshake; a node
// certificate renewed on disk is served after SIGHUP; the leader is killed
// with SIGKILL and the client goes on. Every check below is tied to a doc
// step by a piece of its text; a check whose step is gone fails the test,
// so the doc and the test cannot drift apart.
func TestSecureClusterWalkthrough(t *testing.T) {
	needBinary(t)
	steps := walkthroughSteps(t, walkthroughDoc)
	dir := t.TempDir()
	ports := map[string]string{}
	for i, st := range steps {
		steps[i] = docPort.ReplaceAllStringFunc(st, func(a string) string {
			if ports[a] == "" {
				ports[a] = freePort(t)
			}
			return ports[a]
		})
	}
	api := func(id string) string { return ports["127.0.0.1:700"+id[1:]] }
	pki := filepath.Join(dir, "pki")

	// A client of our own for the waits and checks between steps, with
	// the walkthrough's CA and client certificate (made by step 1).
	var hc *http.Client
	var roots *x509.CertPool
	var app tls.Certificate
	client := func() {
		if hc != nil {
			return
		}
		caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		roots = x509.NewCertPool()
		roots.AppendCertsFromPEM(caPEM)
		if app, err = tls.LoadX509KeyPair(filepath.Join(pki, "app.crt"), filepath.Join(pki, "app.key")); err != nil {
			t.Fatal(err)
		}
		hc = &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{app}}}}
		t.Cleanup(hc.CloseIdleConnections)
	}
	served := func(id string) *x509.Certificate {
		c, err := tls.Dial("tcp", api(id), &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{app}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	pidOf := func(id string) int { return docPID(t, dir, id) }
	nodeLog := func(id string) string { return docLog(dir, id) }
	type member struct {
		ID, API, Role string
		Voter         bool
	}
	// members asks the cluster itself (not a doc step) who leads.
	members := func(endpoints ...string) ([]member, bool) {
		out, _, code := tlsCLI(t, dir, []string{"LOCKD_CA=pki/ca.crt", "LOCKD_CERT=pki/app.crt", "LOCKD_KEY=pki/app.key"},
			"members", "--json", "--token-file", "admin.token", "--endpoints", strings.Join(endpoints, ","))
		var m struct{ Members []member }
		if code != 0 || json.Unmarshal([]byte(out), &m) != nil {
			return nil, false
		}
		return m.Members, true
	}
	leaderOf := func(ms []member) string {
		for _, m := range ms {
			if m.Role == "leader" {
				return m.ID
			}
		}
		return ""
	}

	var before *x509.Certificate
	killed, leaderBefore := "", ""
	type check = docCheck
	fine := func(_, out, errOut string, code int) string {
		if code != 0 {
			return fmt.Sprintf("exit %d", code)
		}
		return ""
	}
	refused := func(want string) func(string, string, string, int) string {
		return func(_, out, errOut string, code int) string {
			if code == 0 || !strings.Contains(errOut, want) {
				return fmt.Sprintf("exit %d, want a refusal with %q", code, want)
			}
			return ""
		}
	}
	serve := func(id string) check {
		return check{match: "lockd serve --node-id " + id, ok: func(_, out, errOut string, code int) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			client()
			pid := pidOf(id)
			if !poll(20*time.Second, func() bool {
				if gone(pid) {
					return true
				}
				resp, err := hc.Get("https://" + api(id) + "/healthz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			}) || gone(pid) {
				return "not serving after 20s:\n" + nodeLog(id)
			}
			return ""
		}}
	}
	checks := []check{
		// Before "lockd members": the kill finds the leader with it.
		{match: "kill -9", pre: func() {
			ms, ok := members(api("n1"), api("n2"), api("n3"))
			if leaderBefore = leaderOf(ms); !ok || leaderBefore == "" {
				t.Fatalf("no leader before the kill: %+v", ms)
			}
		}, ok: func(_, out, errOut string, code int) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			for _, id := range []string{"n1", "n2", "n3"} {
				pid := pidOf(id)
				if poll(5*time.Second, func() bool { return gone(pid) }) {
					killed = id
					break
				}
			}
			if killed != leaderBefore {
				return fmt.Sprintf("killed %q, the leader was %s", killed, leaderBefore)
			}
			return ""
		}},
		{match: "lockd cert ca ", ok: fine},
		{match: "lockd cert node n2 --dir renew", ok: func(_, out, errOut string, code int) string {
			before = served("n2")
			return fine("", out, errOut, code)
		}},
		{match: "lockd cert node ", ok: fine},
		{match: "lockd cert client ", ok: fine},
		{match: "lockd token ", ok: fine},
		{match: "SECURE=", ok: fine},
		serve("n1"), serve("n2"), serve("n3"),
		{match: "export LOCKD_", ok: fine},
		{match: "lockd members", retry: true, ok: func(_, out, errOut string, code int) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			want := 3
			if killed != "" {
				want = 2
			}
			up, leaders := 0, 0
			for _, line := range strings.Split(out, "\n") {
				f := strings.Fields(line)
				if len(f) == 5 && f[2] == "yes" && strings.HasPrefix(f[3], "https://") {
					if f[1] == "leader" {
						leaders++
						if f[0] == killed {
							return "the killed node still leads"
						}
					}
					if f[1] == "leader" || f[1] == "follower" {
						up++
					}
				}
			}
			if up < want || leaders != 1 {
				return fmt.Sprintf("%d https voters up with %d leader, want %d with 1", up, leaders, want)
			}
			return ""
		}},
		{match: "billing.token billing/invoices -- echo invoices sent again", ok: func(_, out, errOut string, code int) string {
			if code != 0 || out != "invoices sent again\n" {
				return fmt.Sprintf("exit %d, want the job run again after the failover", code)
			}
			return ""
		}},
		{match: "billing.token billing/invoices -- echo invoices sent", ok: func(_, out, errOut string, code int) string {
			if code != 0 || out != "invoices sent\n" {
				return fmt.Sprintf("exit %d, want the job run under the lock", code)
			}
			return ""
		}},
		{match: "billing.token payments/", ok: refused("permission denied: identity billing-app may not Acquire")},
		{match: "lockd describe --token-file reader.token billing/", ok: fine},
		{match: "lockd run --token-file reader.token", ok: refused("permission denied: identity viewer may not CreateSession")},
		{match: "lockd snapshot save --token-file admin.token", ok: func(_, out, errOut string, code int) string {
			if code != 0 || !strings.HasPrefix(out, "saved ") {
				return fmt.Sprintf("exit %d", code)
			}
			b, err := os.ReadFile(filepath.Join(dir, "backup.lockd"))
			if err != nil {
				return err.Error()
			}
			if err := fsm.CheckBackup(b); err != nil {
				return "the backup does not load: " + err.Error()
			}
			return ""
		}},
		{match: "LOCKD_CERT= LOCKD_KEY= lockd status", ok: func(_, out, errOut string, code int) string {
			if code != exitUnavailable || !strings.Contains(errOut, "certificate required") {
				return fmt.Sprintf("exit %d, want %d and the TLS cause", code, exitUnavailable)
			}
			return ""
		}},
		{match: "mv renew/", ok: fine},
		{match: "kill -HUP", ok: func(_, out, errOut string, code int) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			if !poll(5*time.Second, func() bool { return !served("n2").Equal(before) }) {
				return "the renewed certificate is not served"
			}
			return ""
		}},
	}
	runDocSteps(t, walkthroughDoc, startDocShell(t, dir), steps, checks, 20*time.Second, func() string { return nodeLog("n1") })

	// Beyond the doc: the audit logs have the refusal, and no token.
	var audit string
	for _, id := range []string{"n1", "n2", "n3"} {
		b, _ := os.ReadFile(filepath.Join(dir, id+".audit"))
		audit += string(b)
	}
	if !strings.Contains(audit, `"identity":"billing-app"`) || !strings.Contains(audit, `"lock":"payments/charge","outcome":"refused"`) {
		t.Errorf("the audit logs lack the refusal:\n%s", audit)
	}
	for _, tok := range []string{"admin.token", "billing.token", "reader.token"} {
		b, _ := os.ReadFile(filepath.Join(dir, tok))
		if s := strings.TrimSpace(string(b)); s == "" || strings.Contains(audit, s) {
			t.Errorf("the audit log carries %s (or it is empty)", tok)
		}
	}
	// Plaintext to a TLS node is refused.
	var alive []string
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != killed {
			alive = append(alive, id)
		}
	}
	if _, errOut, code := tlsCLI(t, dir, []string{"LOCKD_TOKEN_FILE=admin.token"}, "status", "--endpoints", "http://"+api(alive[0])); code == 0 {
		t.Errorf("status over plaintext to a tls node: exit 0: %s", errOut)
	}
	// Without a token, the client certificate's identity (app) has no
	// grant: only Status-level calls pass.
	if _, errOut, code := tlsCLI(t, dir, []string{"LOCKD_CA=pki/ca.crt", "LOCKD_CERT=pki/app.crt", "LOCKD_KEY=pki/app.key"}, "ls", "--endpoints", api(alive[0])); code == 0 || !strings.Contains(errOut, "permission denied") {
		t.Errorf("ls with the certificate and no token: exit %d: %s", code, errOut)
	}
}

// docCheck is what one step of a documented walkthrough must show: the
// step is the one whose text contains match; pre runs before it; ok says
// what is wrong ("" when fine); retry: the step only reads, and may be run
// again until it shows it (a node still joining).
type docCheck struct {
	match string
	retry bool
	pre   func()
	ok    func(step, out, errOut string, code int) string
}

// runDocSteps runs a walkthrough's shell steps in order in sh, each against
// its check (a retried step for at most retryFor), and fails the test when
// a step has no check or a check no step: doc and test cannot drift.
// logs is shown with a failing step.
func runDocSteps(t *testing.T, doc string, sh *docShell, steps []string, checks []docCheck, retryFor time.Duration, logs func() string) {
	t.Helper()
	used := make([]bool, len(checks))
	for _, step := range steps {
		i := slices.IndexFunc(checks, func(c docCheck) bool { return strings.Contains(step, c.match) })
		if i < 0 {
			t.Fatalf("step %q has no check in the test: add one", step)
		}
		used[i] = true
		c := checks[i]
		if c.pre != nil {
			c.pre()
		}
		deadline := time.Now().Add(retryFor)
		for {
			out, errOut, code := sh.run(step, 60*time.Second)
			why := c.ok(step, out, errOut, code)
			if why == "" {
				t.Logf("ok: %s", strings.ReplaceAll(step, "\n", " "))
				break
			}
			if !c.retry || time.Now().After(deadline) {
				t.Fatalf("step %q: %s\nstdout:\n%s\nstderr:\n%s\nlog:\n%s", step, why, out, errOut, logs())
			}
			time.Sleep(200 * time.Millisecond) // between two runs of a read-only step
		}
	}
	for i, c := range checks {
		if !used[i] {
			t.Errorf("%s has no step matching %q: the walkthrough changed, update the test", doc, c.match)
		}
	}
}

// docPID is the pid a walkthrough's shell wrote to dir/ID.pid.
func docPID(t *testing.T, dir, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, id+".pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// docLog is what node ID logged to dir/ID.log in a walkthrough.
func docLog(dir, id string) string {
	b, _ := os.ReadFile(filepath.Join(dir, id+".log"))
	return string(b)
}

package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// installDoc is the page whose walkthrough TestInstallWalkthrough runs.
const installDoc = "../../docs/install.md"

// installPort matches the install walkthrough's addresses, replaced by
// free ports.
var installPort = regexp.MustCompile(`127\.0\.0\.1:7[01]0[1-3]\b`)

// releaseTarball builds the release tarball for this machine with
// scripts/release.sh into dir, stamped with version and commit.
func releaseTarball(t *testing.T, dir, version, commit string) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("scripts/release.sh needs bash")
	}
	cmd := exec.Command("bash", "../../scripts/release.sh")
	cmd.Env = append(os.Environ(), "OUT="+dir, "TARGETS=linux/"+runtime.GOARCH,
		"VERSION="+version, "COMMIT="+commit, "SOURCE_DATE_EPOCH=1700000000")
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "needs GNU tar") && os.Getenv("CI") != "true" {
			t.Skip("scripts/release.sh needs GNU tar")
		}
		t.Fatalf("scripts/release.sh: %v\n%s", err, out)
	}
}

// TestInstallWalkthrough runs the walkthrough of docs/install.md as a
// newcomer would, step by step in one sh: from a release tarball built by
// scripts/release.sh (not the test's own binary) it checks the checksum,
// unpacks, puts lockd on the PATH (lockd version prints the stamped
// version), writes one env file per node like /etc/lockd/lockd.env, starts
// three nodes with the systemd unit's ExecStart command line, sees three
// voters and one leader, /readyz ok, a command run under a lock; then
// stops n1 with SIGTERM (when it leads, it hands leadership over first,
// as its log says), sees the other two carry on, restarts it on its data
// dir and sees three voters again. Every check is tied to a doc step by a
// piece of its text, and a check whose step is gone fails the test.
func TestInstallWalkthrough(t *testing.T) {
	needBinary(t)
	if runtime.GOOS != "linux" {
		t.Skip("the walkthrough uses the linux tarball")
	}
	for _, tool := range []string{"sha256sum", "curl", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("the walkthrough needs %s", tool)
			}
			t.Skipf("the walkthrough needs %s", tool)
		}
	}
	dir := t.TempDir()
	const version, commit = "v0.0.0-walkthrough", "0123456789abcdef"
	releaseTarball(t, dir, version, commit)

	// The unit's command line is the one the walkthrough runs each node
	// with (its data dir in place of /var/lib/lockd).
	unit, err := os.ReadFile("../../deploy/systemd/lockd.service")
	if err != nil {
		t.Fatal(err)
	}
	const execStart = "lockd serve --data-dir /var/lib/lockd $LOCKD_SERVE_FLAGS"
	if !strings.Contains(string(unit), "\nExecStart=/usr/local/bin/"+execStart+"\n") {
		t.Fatalf("lockd.service: no ExecStart=/usr/local/bin/%s", execStart)
	}

	steps := walkthroughSteps(t, installDoc)
	ports := map[string]string{}
	for i, st := range steps {
		st = strings.ReplaceAll(st, "_linux_amd64", "_linux_"+runtime.GOARCH)
		steps[i] = installPort.ReplaceAllStringFunc(st, func(a string) string {
			if ports[a] == "" {
				ports[a] = freePort(t)
			}
			return ports[a]
		})
	}
	api := func(id string) string { return ports["127.0.0.1:700"+id[1:]] }
	hc := &http.Client{Timeout: time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	pidOf := func(id string) int { return docPID(t, dir, id) }
	nodeLog := func(id string) string { return docLog(dir, id) }
	// leader asks the cluster itself (not a doc step) who leads.
	leader := func() string {
		cmd := exec.Command(lockdBin, "members", "--json", "--endpoints", "http://"+api("n2")+",http://"+api("n3"))
		out, err := cmd.Output()
		var m struct{ Members []struct{ ID, Role string } }
		if err != nil || json.Unmarshal(out, &m) != nil {
			return ""
		}
		for _, x := range m.Members {
			if x.Role == "leader" {
				return x.ID
			}
		}
		return ""
	}

	stopped, leaderBefore := "", ""
	type check = docCheck
	fine := func(step, out, errOut string, code int) string {
		if code != 0 {
			return fmt.Sprintf("exit %d", code)
		}
		return ""
	}
	nodeOf := regexp.MustCompile(`--data-dir \./(n[123]) `)
	checks := []check{
		{match: "sha256sum -c", ok: func(step, out, errOut string, code int) string {
			if code != 0 || !strings.Contains(out, "_linux_"+runtime.GOARCH+".tar.gz: OK") {
				return fmt.Sprintf("exit %d, want the tarball's checksum OK", code)
			}
			return ""
		}},
		{match: "tar xzf", ok: fine},
		{match: "mkdir -p bin", ok: fine},
		{match: "export PATH=", ok: fine},
		{match: "lockd version", ok: func(step, out, errOut string, code int) string {
			want := "lockd " + version + " commit " + commit + " go"
			if code != 0 || !strings.HasPrefix(out, want) {
				return fmt.Sprintf("exit %d, want the release binary's %q…", code, want)
			}
			return ""
		}},
		{match: "echo 'LOCKD_SERVE_FLAGS=", ok: fine},
		{match: "exec lockd serve --data-dir ./n", ok: func(step, out, errOut string, code int) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			id := nodeOf.FindStringSubmatch(step)[1]
			if unitLine := strings.Replace(execStart, "/var/lib/lockd", "./"+id, 1); !strings.Contains(step, ". ./"+id+".env && exec "+unitLine+")") {
				return "not the unit's command line with " + id + "'s env file: " + unitLine
			}
			pid := pidOf(id)
			if !poll(30*time.Second, func() bool {
				if gone(pid) {
					return true
				}
				resp, err := hc.Get("http://" + api(id) + "/healthz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			}) || gone(pid) {
				return "not serving after 30s:\n" + nodeLog(id)
			}
			if id == stopped {
				stopped = ""
			}
			return ""
		}},
		{match: "export LOCKD_ENDPOINTS=", ok: fine},
		{match: "lockd members", retry: true, ok: func(step, out, errOut string, code int) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			want := 3
			if stopped != "" {
				want = 2
			}
			up, leaders := 0, 0
			for _, line := range strings.Split(out, "\n") {
				f := strings.Fields(line)
				if len(f) != 5 || f[2] != "yes" || !strings.HasPrefix(f[3], "http://") {
					continue
				}
				switch f[1] {
				case "leader":
					leaders++
					if f[0] == stopped {
						return "the stopped node still leads"
					}
					up++
				case "follower":
					up++
				}
			}
			if up != want || leaders != 1 {
				return fmt.Sprintf("%d voters up with %d leader, want %d with 1", up, leaders, want)
			}
			return ""
		}},
		{match: "/readyz", retry: true, ok: func(step, out, errOut string, code int) string {
			if code != 0 || out != "ok\n" {
				return fmt.Sprintf("exit %d, want ok", code)
			}
			return ""
		}},
		{match: "lockd run demo/nightly -- echo", ok: func(step, out, errOut string, code int) string {
			if code != 0 || out != "ran under the lock\n" {
				return fmt.Sprintf("exit %d, want the command's output", code)
			}
			return ""
		}},
		{match: "kill $(cat n1.pid)", pre: func() {
			if !poll(20*time.Second, func() bool { leaderBefore = leader(); return leaderBefore != "" }) {
				t.Fatal("no leader before the stop")
			}
		}, ok: func(step, out, errOut string, code int) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			pid := pidOf("n1")
			if !poll(30*time.Second, func() bool { return gone(pid) }) {
				return "n1 still runs 30s after SIGTERM"
			}
			stopped = "n1"
			if leaderBefore == "n1" && !strings.Contains(nodeLog("n1"), "leadership transferred on shutdown") {
				return "n1 led and stopped without handing leadership over:\n" + nodeLog("n1")
			}
			return ""
		}},
	}
	runDocSteps(t, installDoc, startDocShell(t, dir), steps, checks, 30*time.Second, func() string { return nodeLog("n1") })
	t.Logf("leader before the stop: %s", leaderBefore)
}

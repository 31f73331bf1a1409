package chart

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestStartCommandPerOrdinal runs the rendered start script of every values
// combination docs/kubernetes.md shows for every pod ordinal, with the
// pods' real DNS-form addresses, and checks the `lockd serve` command it
// would exec: pod 0 on an empty disk with no member answering bootstraps
// (no --join), every other pod joins through all the others (never
// itself), every pod advertises its own stable name on the chart's ports,
// and a pod with data resumes (no --join). LOCKD_BIN is a stand-in that
// prints its arguments and answers the membership probe "nobody answered"
// (exit 69): the real-process version is TestStartScriptRealCluster.
func TestStartCommandPerOrdinal(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	exs, err := DocExamples()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "lockd")
	stub := "#!/bin/sh\nif [ \"$1\" = members ]; then exit 69; fi\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n"
	if err := os.WriteFile(bin, []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, ex := range exs {
		t.Run(ex.Name, func(t *testing.T) {
			docs, _, err := Render(c, "lockd", "locks", ex.Values)
			if err != nil {
				t.Fatal(err)
			}
			o := decode(t, docs)
			script := filepath.Join(t.TempDir(), "start.sh")
			if err := os.WriteFile(script, []byte(o.cms[0].Data["start.sh"]), 0o755); err != nil {
				t.Fatal(err)
			}
			ct := o.sts.Spec.Template.Spec.Containers[0]
			env := map[string]string{}
			var envList []string
			for _, e := range ct.Env {
				if e.ValueFrom == nil {
					env[e.Name] = e.Value
					envList = append(envList, e.Name+"="+e.Value)
				}
			}
			n := int(*o.sts.Spec.Replicas)
			url := func(i int) string {
				return fmt.Sprintf("%s://%s-%d.%s:%s", env["LOCKD_SCHEME"], o.sts.Name, i, env["LOCKD_DOMAIN"], env["LOCKD_API_PORT"])
			}
			for i := range n {
				name := fmt.Sprintf("%s-%d", o.sts.Name, i)
				data := t.TempDir()
				run := func() []string {
					cmd := exec.Command("sh", append([]string{script}, ct.Args...)...)
					cmd.Env = append(append(os.Environ(), envList...), "POD_NAME="+name, "LOCKD_DATA_DIR="+data, "LOCKD_BIN="+bin)
					out, err := cmd.Output()
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					return strings.Split(strings.TrimSpace(string(out)), "\n")
				}
				flag := func(args []string, f string) string {
					if k := slices.Index(args, f); k >= 0 && k+1 < len(args) {
						return args[k+1]
					}
					return ""
				}
				args := run()
				if args[0] != "serve" || flag(args, "--node-id") != name || flag(args, "--data-dir") != data {
					t.Errorf("%s: %v", name, args)
				}
				if got := flag(args, "--advertise"); got != url(i) {
					t.Errorf("%s advertises %s, want %s", name, got, url(i))
				}
				if got, want := flag(args, "--raft-advertise"), fmt.Sprintf("%s.%s:%s", name, env["LOCKD_DOMAIN"], env["LOCKD_RAFT_PORT"]); got != want {
					t.Errorf("%s raft-advertise %s, want %s", name, got, want)
				}
				if got, want := flag(args, "--listen"), "0.0.0.0:"+env["LOCKD_API_PORT"]; got != want {
					t.Errorf("%s listens on %s, want %s", name, got, want)
				}
				for _, a := range ct.Args {
					if !slices.Contains(args, a) {
						t.Errorf("%s: chart arg %s not passed on", name, a)
					}
				}
				join := flag(args, "--join")
				if i == 0 || n == 1 {
					if join != "" {
						t.Errorf("%s on an empty disk with no member answering must bootstrap, got --join %s", name, join)
					}
				} else {
					var want []string
					for j := range n {
						if j != i {
							want = append(want, url(j))
						}
					}
					if join != strings.Join(want, ",") {
						t.Errorf("%s joins %q, want %q", name, join, strings.Join(want, ","))
					}
				}
				// With data it resumes, whatever the ordinal.
				if err := os.WriteFile(filepath.Join(data, "node-id"), []byte(name), 0o644); err != nil {
					t.Fatal(err)
				}
				if args := run(); slices.Contains(args, "--join") {
					t.Errorf("%s with data must resume, got %v", name, args)
				}
			}
		})
	}
}

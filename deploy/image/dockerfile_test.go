package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// finalStage returns the instructions of the Dockerfile's last stage, one
// per logical line (continuations joined), comments dropped.
func finalStage(t *testing.T) [][2]string {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var stage [][2]string
	cont := ""
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cont += s + " "
			continue
		}
		line, cont = cont+line, ""
		kw, rest, _ := strings.Cut(line, " ")
		kw = strings.ToUpper(kw)
		if kw == "FROM" {
			stage = nil
		}
		stage = append(stage, [2]string{kw, strings.TrimSpace(rest)})
	}
	return stage
}

// TestDockerfileMatchesImage holds the Dockerfile's final stage and the
// image this program builds to one shape: the same base (none), user,
// working dir, volume, ports, stop signal, entrypoint and command, the same
// files copied in, and the same /etc/passwd and /etc/group.
func TestDockerfileMatchesImage(t *testing.T) {
	want := imageConfig(Meta{Created: time.Unix(0, 0)})
	stage := finalStage(t)
	var ports, volumes, copies []string
	got := map[string]string{}
	jsonList := func(kw, v string) []string {
		var l []string
		if err := json.Unmarshal([]byte(v), &l); err != nil {
			t.Errorf("%s %s: want the exec (JSON) form, so no shell is needed: %v", kw, v, err)
		}
		return l
	}
	for _, in := range stage {
		kw, v := in[0], in[1]
		switch kw {
		case "EXPOSE":
			ports = append(ports, strings.Fields(v)...)
		case "VOLUME":
			volumes = append(volumes, jsonList(kw, v)...)
		case "COPY":
			f := strings.Fields(v)
			copies = append(copies, strings.Join(slices.DeleteFunc(f[:len(f)-1], func(s string) bool { return strings.HasPrefix(s, "--from") }), " ")+" -> "+f[len(f)-1])
		case "ENTRYPOINT", "CMD":
			got[kw] = fmt.Sprint(jsonList(kw, v))
		default:
			if _, dup := got[kw]; dup {
				t.Errorf("%s twice in the final stage", kw)
			}
			got[kw] = v
		}
	}
	check := func(what, gotV, wantV string) {
		t.Helper()
		if gotV != wantV {
			t.Errorf("%s: Dockerfile says %q, the image has %q", what, gotV, wantV)
		}
	}
	check("FROM", got["FROM"], "scratch")
	check("USER", got["USER"], want.User)
	check("WORKDIR", got["WORKDIR"], want.WorkingDir)
	check("STOPSIGNAL", got["STOPSIGNAL"], want.StopSignal)
	check("ENTRYPOINT", got["ENTRYPOINT"], fmt.Sprint(want.Entrypoint))
	check("CMD", got["CMD"], fmt.Sprint(want.Cmd))
	slices.Sort(ports)
	check("EXPOSE", fmt.Sprint(ports), fmt.Sprint(sortedKeys(want.ExposedPorts)))
	check("VOLUME", fmt.Sprint(volumes), fmt.Sprint(sortedKeys(want.Volumes)))
	for _, kw := range []string{"RUN", "SHELL", "HEALTHCHECK", "ENV", "ADD"} {
		if _, ok := got[kw]; ok {
			t.Errorf("%s in the final stage: the Go-built image has no equivalent", kw)
		}
	}

	// The files: each COPY's destination is a file or directory of the
	// layer, owned as the layer owns it, and together they are the layer.
	wantCopies := []string{
		"/out/etc/passwd /out/etc/group -> /etc/",
		"/out/tmp -> /tmp",
		"/out/usr/local/bin/lockd -> " + binPath,
		fmt.Sprintf("--chown=%d:%d /out/var/lib/lockd -> %s", uid, gid, dataDir),
	}
	check("COPY", strings.Join(copies, "; "), strings.Join(wantCopies, "; "))
	var leaves []string
	for _, f := range layerFiles(nil) {
		if !f.dir || f.name == "tmp/" || f.name == "var/lib/lockd/" {
			leaves = append(leaves, "/"+strings.TrimSuffix(f.name, "/"))
		}
	}
	check("layer files", fmt.Sprint(leaves), "[/etc/group /etc/passwd /tmp /usr/local/bin/lockd /var/lib/lockd]")

	// The build stage writes /etc/passwd and /etc/group with printf; the
	// same bytes as the layer's.
	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range layerFiles(nil) {
		if f.name == "etc/passwd" || f.name == "etc/group" {
			printf := "printf '" + strings.ReplaceAll(string(f.body), "\n", `\n`) + "' >/out/" + f.name
			if !strings.Contains(string(df), printf) {
				t.Errorf("Dockerfile does not write /%s as the image does: want %s", f.name, printf)
			}
		}
	}
	if !strings.Contains(string(df), "chmod 0700 /out/var/lib/lockd && chmod 1777 /out/tmp") {
		t.Error("Dockerfile: the data dir 0700 and /tmp 1777, as in the layer")
	}
}

func sortedKeys(m map[string]struct{}) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}

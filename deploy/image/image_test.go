package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

const (
	testVersion = "v9.9.9-imagetest"
	testCommit  = "0123456789abcdef"
)

// buildLockd builds lockd from this repository for linux on this machine's
// architecture, stamped as scripts/release.sh stamps it.
func buildLockd(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the image's binary runs on linux only")
	}
	bin := filepath.Join(t.TempDir(), "lockd")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X main.version="+testVersion+" -X main.commit="+testCommit,
		"-o", bin, "./cmd/lockd")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// archive is an unpacked OCI archive: its files by name.
type archive map[string][]byte

func readArchive(t *testing.T, file string) archive {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := archive{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return a
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		a[h.Name] = b
	}
}

// blob returns the blob a descriptor names, after checking its digest and
// size (a reader does the same).
func (a archive) blob(t *testing.T, d v1.Descriptor) []byte {
	t.Helper()
	b, ok := a["blobs/sha256/"+d.Digest.Hex]
	if !ok {
		t.Fatalf("blob %s missing", d.Digest)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != d.Digest.Hex || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: digest or size does not match", d.Digest)
	}
	return b
}

func (a archive) json(t *testing.T, d v1.Descriptor, v any) {
	t.Helper()
	if err := json.Unmarshal(a.blob(t, d), v); err != nil {
		t.Fatalf("blob %s: %v", d.Digest, err)
	}
}

// TestImage builds the image from a freshly built lockd, twice, and reads
// the archive back the way a container runtime would: the index, the
// platform's manifest, its config and its one layer. It checks what a user
// depends on: entrypoint in exec form, a non-root user, the exposed ports,
// the volume, the stop signal, no shell or any other program in the
// layer, the data dir owned by the user, and that the binary taken out of
// the layer runs `lockd version` and prints the stamped version.
func TestImage(t *testing.T) {
	bin := buildLockd(t)
	dir := t.TempDir()
	plat := "linux/" + runtime.GOARCH
	build := func(out string) {
		t.Helper()
		err := run([]string{"-bin", plat + "=" + bin, "-version", testVersion, "-commit", testCommit, "-created", "1700000000", "-out", out, "-layout", out + ".d"})
		if err != nil {
			t.Fatal(err)
		}
	}
	first, second := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	build(first)
	build(second)
	a, b := mustRead(t, first), mustRead(t, second)
	if !bytes.Equal(a, b) {
		t.Fatal("two builds from the same binary differ: the image is not reproducible")
	}

	// ggcr's own checks on the layout (digests, sizes, diff ids, config).
	lp, err := layout.FromPath(first + ".d")
	if err != nil {
		t.Fatal(err)
	}
	ii, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(ii); err != nil {
		t.Fatalf("layout does not validate: %v", err)
	}

	ar := readArchive(t, first)
	var ol struct{ ImageLayoutVersion string }
	if err := json.Unmarshal(ar["oci-layout"], &ol); err != nil || ol.ImageLayoutVersion != "1.0.0" {
		t.Fatalf("oci-layout = %q, want imageLayoutVersion 1.0.0", ar["oci-layout"])
	}
	var top v1.IndexManifest
	if err := json.Unmarshal(ar["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Annotations["io.containerd.image.name"] != "lockd:"+testVersion {
		t.Fatalf("index.json: want one index named lockd:%s, got %+v", testVersion, top.Manifests)
	}
	var idx v1.IndexManifest
	ar.json(t, top.Manifests[0], &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Platform == nil || idx.Manifests[0].Platform.String() != plat {
		t.Fatalf("index: want one manifest for %s, got %+v", plat, idx.Manifests)
	}
	var man v1.Manifest
	ar.json(t, idx.Manifests[0], &man)
	var cf v1.ConfigFile
	ar.json(t, man.Config, &cf)

	c := cf.Config
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want %s", cf.OS, cf.Architecture, plat)
	}
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/lockd"}) {
		t.Errorf("entrypoint %q, want the binary in exec form (no shell)", c.Entrypoint)
	}
	if !slices.Equal(c.Cmd, []string{"serve", "--data-dir", "/var/lib/lockd"}) {
		t.Errorf("cmd %q", c.Cmd)
	}
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", c.User)
	}
	if len(c.ExposedPorts) != 2 || !has(c.ExposedPorts, "7070/tcp") || !has(c.ExposedPorts, "7071/tcp") {
		t.Errorf("exposed ports %v, want 7070/tcp (API) and 7071/tcp (Raft)", c.ExposedPorts)
	}
	if len(c.Volumes) != 1 || !has(c.Volumes, "/var/lib/lockd") {
		t.Errorf("volumes %v, want /var/lib/lockd", c.Volumes)
	}
	if c.StopSignal != "SIGTERM" {
		t.Errorf("stop signal %q, want SIGTERM", c.StopSignal)
	}
	if c.Labels["org.opencontainers.image.version"] != testVersion || c.Labels["org.opencontainers.image.revision"] != testCommit {
		t.Errorf("labels %v", c.Labels)
	}

	if len(man.Layers) != 1 {
		t.Fatalf("%d layers, want 1", len(man.Layers))
	}
	zr, err := gzip.NewReader(bytes.NewReader(ar.blob(t, man.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var lockd []byte
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		names = append(names, name)
		switch {
		case h.Typeflag == tar.TypeReg && h.Mode&0o111 != 0 && name != "usr/local/bin/lockd":
			t.Errorf("%s: an executable besides lockd", name)
		case h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeDir:
			t.Errorf("%s: type %c, want only files and directories (no links)", name, h.Typeflag)
		case name == "var/lib/lockd" && (h.Uid != 65532 || h.Gid != 65532 || h.Mode&0o777 != 0o700):
			t.Errorf("/var/lib/lockd: %d:%d %o, want 65532:65532 0700", h.Uid, h.Gid, h.Mode)
		case name == "usr/local/bin/lockd":
			if lockd, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []string{"etc", "etc/group", "etc/passwd", "tmp", "usr", "usr/local", "usr/local/bin", "usr/local/bin/lockd", "var", "var/lib", "var/lib/lockd"}
	if !slices.Equal(names, want) {
		t.Errorf("layer holds %q, want exactly %q (no shell, no libc)", names, want)
	}

	// The binary from the layer runs and says what it is.
	x := filepath.Join(t.TempDir(), "lockd")
	if err := os.WriteFile(x, lockd, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(x, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("lockd version from the image: %v\n%s", err, out)
	}
	wantOut := "lockd " + testVersion + " commit " + testCommit + " go"
	if !strings.HasPrefix(string(out), wantOut) || !strings.HasSuffix(strings.TrimSpace(string(out)), plat) {
		t.Errorf("lockd version printed %q, want %q… %s", out, wantOut, plat)
	}
	probeAndStop(t, x, c)
}

// probeAndStop runs the image's command (entrypoint replaced by the
// extracted binary, the data dir by a temp dir, on free loopback ports),
// waits until the probe paths the docs name answer 200, then sends the
// image's stop signal and wants a clean exit within the 10 s a container
// engine grants by default.
func probeAndStop(t *testing.T, bin string, c v1.Config) {
	t.Helper()
	data := t.TempDir()
	var args []string
	for _, a := range c.Cmd {
		args = append(args, strings.ReplaceAll(a, dataDir, data))
	}
	api, raft := freeAddr(t), freeAddr(t)
	args = append(args, "--listen", api, "--raft-listen", raft)
	cmd := exec.Command(bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	hc := &http.Client{Timeout: time.Second}
	for _, probe := range []string{"/healthz", "/readyz"} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := hc.Get("http://" + api + probe)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not 200 after 30s (last: %v)", probe, err)
			}
			select {
			case err := <-exited:
				t.Fatalf("lockd %q exited: %v\n%s", args, err, logs.String())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	sig, ok := map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT}[c.StopSignal]
	if !ok {
		t.Fatalf("stop signal %q: not one lockd stops cleanly on", c.StopSignal)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after %s: %v\n%s", c.StopSignal, err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Errorf("still running 10s after %s\n%s", c.StopSignal, logs.String())
	}
}

// freeAddr returns a loopback address free now, below the kernel's
// ephemeral range (32768 and up on Linux) so that no outgoing connection
// takes it before lockd binds it.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 200 {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
		if err != nil {
			continue
		}
		l.Close()
		return l.Addr().String()
	}
	t.Fatal("no free port in 20000-31999")
	return ""
}

func has(m map[string]struct{}, k string) bool {
	_, ok := m[k]
	return ok
}

func mustRead(t *testing.T, f string) []byte {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

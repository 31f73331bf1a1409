package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's shape, the same as the final stage of the repository's
// Dockerfile (dockerfile_test.go holds them to it).
const (
	// binPath is where the lockd binary lives in the image.
	binPath = "/usr/local/bin/lockd"
	// dataDir is the volume: the node's Raft log, snapshots and id.
	dataDir = "/var/lib/lockd"
	// uid and gid of the unprivileged user the image runs as ("nonroot",
	// as in the distroless images).
	uid, gid = 65532, 65532
	// apiPort serves the API, /metrics, /healthz, /readyz and the dashboard.
	apiPort = "7070/tcp"
	// raftPort is Raft, between members only.
	raftPort = "7071/tcp"
	// stopSignal makes a leader hand over before it exits.
	stopSignal = "SIGTERM"
	// defaultPath is the PATH a build from scratch records.
	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Meta is what the image records about the build.
type Meta struct {
	// Version and Commit are the binary's, recorded as OCI labels.
	Version, Commit string
	// Created is the image's creation time and every file's mtime; a fixed
	// one (the commit's time) keeps the image reproducible.
	Created time.Time
}

// imageConfig returns the container configuration: what the Dockerfile's
// USER, WORKDIR, VOLUME, EXPOSE, STOPSIGNAL, ENTRYPOINT and CMD say.
func imageConfig(m Meta) v1.Config {
	return v1.Config{
		User:         fmt.Sprintf("%d:%d", uid, gid),
		WorkingDir:   dataDir,
		Env:          []string{defaultPath},
		Volumes:      map[string]struct{}{dataDir: {}},
		ExposedPorts: map[string]struct{}{apiPort: {}, raftPort: {}},
		StopSignal:   stopSignal,
		Entrypoint:   []string{binPath},
		Cmd:          []string{"serve", "--data-dir", dataDir},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "lockd",
			"org.opencontainers.image.version":  m.Version,
			"org.opencontainers.image.revision": m.Commit,
			"org.opencontainers.image.source":   "https://github.com/lockd-dev/lockd",
		},
	}
}

// layerFile is one entry of the image's only layer.
type layerFile struct {
	name     string // without the leading slash
	mode     int64
	uid, gid int
	dir      bool
	body     []byte
}

// layerFiles lists the layer: the user, /tmp, the binary and the data
// dir the user owns. Nothing else: no shell, no libc.
func layerFiles(bin []byte) []layerFile {
	return []layerFile{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/local/", mode: 0o755, dir: true},
		{name: "usr/local/bin/", mode: 0o755, dir: true},
		{name: "usr/local/bin/lockd", mode: 0o755, body: bin},
		{name: "var/", mode: 0o755, dir: true},
		{name: "var/lib/", mode: 0o755, dir: true},
		{name: "var/lib/lockd/", mode: 0o700, uid: uid, gid: gid, dir: true},
	}
}

// layerTar writes the layer's files as an uncompressed tar, in a fixed
// order with fixed times, so the same binary gives the same bytes.
func layerTar(bin []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range layerFiles(bin) {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: mtime, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// buildImage returns the image for one platform from a lockd binary built
// for it.
func buildImage(binFile string, p v1.Platform, m Meta) (v1.Image, error) {
	bin, err := os.ReadFile(binFile)
	if err != nil {
		return nil, fmt.Errorf("binary: %w", err)
	}
	raw, err := layerTar(bin, m.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: m.Created},
			CreatedBy: "deploy/image: lockd " + m.Version,
			Comment:   "the static lockd binary, /etc/passwd, /tmp and the data dir",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Variant = p.Architecture, p.OS, p.Variant
	cf.Created = v1.Time{Time: m.Created}
	cf.Config = imageConfig(m)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return img, nil
}

// buildIndex returns the multi-platform index of one image per binary.
func buildIndex(bins []platformBinary, m Meta) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range bins {
		img, err := buildImage(b.file, b.platform, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.platform, err)
		}
		p := b.platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return idx, nil
}

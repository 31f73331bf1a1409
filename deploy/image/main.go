// Command image builds the lockd container image without a container
// engine: from lockd binaries built by scripts/release.sh (one per
// platform) it writes an OCI image layout holding a multi-platform index,
// and that layout as one tar file (an "oci-archive": `docker load`,
// `podman load`, `skopeo copy oci-archive:…` and `crane push` read it). The
// image is the one the repository's Dockerfile builds: the static binary
// on an empty base, user 65532, the /var/lib/lockd volume, ports 7070 and
// 7071, SIGTERM to stop.
//
//	go run . -bin linux/amd64=../../dist/linux_amd64/lockd -bin linux/arm64=… \
//	    -version v1.2.0 -commit 3f9c2e1 -out /tmp/lockd-image.tar
//
// The same binaries, version, commit and -created give the same bytes.
package main

import (
	"archive/tar"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// platformBinary is one -bin flag: a platform and its lockd binary.
type platformBinary struct {
	platform v1.Platform
	file     string
}

// binFlags collects the repeated -bin flag.
type binFlags []platformBinary

func (b *binFlags) String() string { return fmt.Sprint(*b) }

func (b *binFlags) Set(v string) error {
	plat, file, ok := strings.Cut(v, "=")
	if !ok || file == "" {
		return errors.New("want OS/ARCH=PATH, e.g. linux/amd64=dist/lockd")
	}
	p, err := v1.ParsePlatform(plat)
	if err != nil || p.OS == "" || p.Architecture == "" {
		return fmt.Errorf("platform %q: want OS/ARCH", plat)
	}
	*b = append(*b, platformBinary{platform: *p, file: file})
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		slog.Error("image", "err", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var bins binFlags
	fs.Var(&bins, "bin", "OS/ARCH=PATH of a lockd binary built for that platform (repeat for each platform)")
	version := fs.String("version", "", "the binaries' version, recorded as a label and the image's name tag (required)")
	commit := fs.String("commit", "unknown", "the binaries' commit, recorded as a label")
	name := fs.String("name", "lockd", "image name; the tag is -version")
	created := fs.Int64("created", 0, "creation time and file times, Unix seconds (e.g. $SOURCE_DATE_EPOCH); fixed so builds are reproducible")
	out := fs.String("out", "lockd-image.tar", "the OCI archive to write")
	dir := fs.String("layout", "", "also keep the OCI layout directory here (must not exist)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(bins) == 0 || *version == "" || fs.NArg() > 0 {
		return errors.New("usage: image -bin OS/ARCH=PATH [-bin …] -version V [-commit C] [-created UNIX] [-out FILE] [-layout DIR]")
	}
	m := Meta{Version: *version, Commit: *commit, Created: time.Unix(*created, 0).UTC()}
	ref := *name + ":" + *version
	layoutDir := *dir
	if layoutDir == "" {
		tmp, err := os.MkdirTemp("", "lockd-image-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		layoutDir = filepath.Join(tmp, "layout")
	}
	if err := writeLayout(layoutDir, bins, m, ref); err != nil {
		return err
	}
	if err := tarDir(layoutDir, *out, m.Created); err != nil {
		return err
	}
	st, err := os.Stat(*out)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s, %d bytes)\n", *out, ref, st.Size())
	return nil
}

// writeLayout writes the OCI layout: index.json names one multi-platform
// index, tagged ref.
func writeLayout(dir string, bins []platformBinary, m Meta, ref string) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("layout %s: already exists", dir)
	}
	idx, err := buildIndex(bins, m)
	if err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	// The first name is the OCI one; containerd and docker load read the
	// second.
	err = p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": refTag(ref),
		"io.containerd.image.name":          ref,
	}))
	if err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	return nil
}

// refTag returns the tag of name:tag.
func refTag(ref string) string {
	return ref[strings.LastIndexByte(ref, ':')+1:]
}

// tarDir writes dir's files into a tar at out, sorted, with fixed owners,
// modes and times.
func tarDir(dir, out string, mtime time.Time) error {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, err := filepath.Rel(dir, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	sort.Strings(files)
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, name := range files {
		src, err := os.Open(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			return fmt.Errorf("archive: %w", err)
		}
		st, err := src.Stat()
		if err == nil {
			err = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: st.Size(), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX})
		}
		if err == nil {
			_, err = io.Copy(tw, src)
		}
		src.Close()
		if err != nil {
			return fmt.Errorf("archive %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	return f.Close()
}

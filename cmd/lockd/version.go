package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// commit is the source revision, set at build time with -ldflags
// "-X main.commit=<sha>" (scripts/release.sh does); otherwise it comes from
// the build info's vcs.revision when the go command stamped one, else
// "unknown". Release builds stamp it themselves because they build with
// -buildvcs=false: the VCS stamp records a dirty flag and a time that
// would make two builds of one commit differ.
var commit = ""

// VersionCommand is `lockd version`.
type VersionCommand struct {
	// Stdout receives the version line.
	Stdout io.Writer
	// Stderr receives usage errors.
	Stderr io.Writer
}

// Run prints the version of this binary: the tag, the commit, the Go
// version it was built with and the platform, e.g.
// "lockd v1.2.0 commit 3f9c2e1 go1.26.8 linux/arm64".
func (c *VersionCommand) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("version", c.Stderr)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("usage: lockd version")}
	}
	_, err := fmt.Fprintf(c.Stdout, "lockd %s commit %s %s %s/%s\n", version, buildCommit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return err
}

// buildCommit returns the stamped commit, or the one the go command
// recorded (with "-dirty" for a modified tree), or "unknown".
func buildCommit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
)

// VersionCommand is `lockd version`.
type VersionCommand struct {
	// Stdout receives the version line.
	Stdout io.Writer
	// Stderr receives usage errors.
	Stderr io.Writer
}

// Run prints the version of this binary.
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
	_, err := fmt.Fprintf(c.Stdout, "lockd %s %s %s/%s\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return err
}

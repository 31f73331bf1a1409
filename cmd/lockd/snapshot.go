package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
)

// SnapshotCommand is `lockd snapshot save FILE`: write a consistent backup
// of the cluster's state, read on the leader (a follower redirects there).
// `lockd serve --restore FILE` starts a new cluster from it.
type SnapshotCommand struct {
	env commandEnv
}

const snapshotUsage = "lockd snapshot save [--endpoints URLS] FILE"

// Run saves the backup from the first endpoint that answers.
func (c *SnapshotCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "save" {
		return usageError{fmt.Errorf("usage: %s", snapshotUsage)}
	}
	fs := newFlagSet("snapshot save", c.env.stderr)
	var cf clientFlags
	cf.register(fs, c.env.getenv)
	cf.registerTimeout(fs)
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return err
	}
	if err := wantArgs(pos, 1, 1, snapshotUsage); err != nil {
		return err
	}
	file := pos[0]
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()
	var errs []error
	for _, u := range endpointURLs(cf.endpoints) {
		n, err := saveSnapshot(ctx, u+"/v1/snapshot", file)
		if err == nil {
			fmt.Fprintf(c.env.stdout, "saved %d bytes from %s to %s\n", n, u, file)
			return nil
		}
		errs = append(errs, err)
	}
	return exitWith(exitUnavailable, fmt.Errorf("snapshot save: %w", errors.Join(errs...)))
}

// saveSnapshot downloads url into file atomically (temp file, fsync,
// rename), so a failed download never leaves a truncated backup.
func saveSnapshot(ctx context.Context, url, file string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".lockd-snapshot-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, resp.Body)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), file)
	}
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", file, err)
	}
	return n, nil
}

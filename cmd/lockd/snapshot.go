package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lockd-dev/lockd"
)

// SnapshotCommand is `lockd snapshot save FILE`: write a consistent backup
// of the cluster's state, read on the leader (a follower redirects there).
// `lockd serve --restore FILE` starts a new cluster from it.
type SnapshotCommand struct {
	env commandEnv
}

const snapshotUsage = "lockd snapshot save [--endpoints URLS] FILE"

// Run saves the backup through the client, which moves between the
// endpoints and checks the cluster id as for every other call.
func (c *SnapshotCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "save" {
		return usageError{fmt.Errorf("usage: %s", snapshotUsage)}
	}
	pos, cf, err := c.env.parse("snapshot save", snapshotUsage, args[1:], 1, 1, nil)
	if err != nil {
		return err
	}
	file := pos[0]
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	n, err := saveSnapshot(ctx, cl, file)
	if err != nil {
		return callError("snapshot save", err)
	}
	fmt.Fprintf(c.env.stdout, "saved %d bytes of cluster %s to %s\n", n, printable(cl.ClusterID()), file)
	return nil
}

// saveSnapshot downloads the backup into file atomically (temp file, fsync,
// rename), so a failed download never leaves a truncated backup.
func saveSnapshot(ctx context.Context, cl *lockd.Client, file string) (int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".lockd-snapshot-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	n, err := cl.Snapshot(ctx, tmp)
	if err != nil {
		tmp.Close()
		return 0, err
	}
	err = tmp.Sync()
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

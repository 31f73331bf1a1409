package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// ReleaseCommand is `lockd release --force NAME [--unsafe-now]`: an admin
// operation that revokes the sessions holding a lock.
type ReleaseCommand struct {
	env commandEnv
}

// Run force-releases the lock. The holders' sessions are revoked (they
// expire); the lock is granted again only after their TTL + grace, when
// their clients have surely stopped, unless --unsafe-now.
func (c *ReleaseCommand) Run(ctx context.Context, args []string) error {
	var force, unsafeNow *bool
	pos, cf, err := c.env.parse("release", "lockd release --force NAME [--unsafe-now]", args, 1, 1, func(fs *flag.FlagSet) {
		force = fs.Bool("force", false, "required: revoke the holders' sessions (a holder releases its own lock by itself)")
		unsafeNow = fs.Bool("unsafe-now", false, "expire the holders at once instead of after TTL + grace; BREAKS MUTUAL EXCLUSION: an old holder may still be running")
	})
	if err != nil {
		return err
	}
	if !*force {
		return usageError{errors.New("release needs --force: it revokes the sessions holding the lock, which lose every lock they hold")}
	}
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := cl.Service().ForceRelease(ctx, connect.NewRequest(&lockdv1.ForceReleaseRequest{Name: pos[0], UnsafeNow: *unsafeNow}))
	if err != nil {
		return callError(fmt.Sprintf("force-release %q", pos[0]), err)
	}
	ids := resp.Msg.GetSessionIds()
	switch {
	case len(ids) == 0:
		fmt.Fprintf(c.env.stdout, "lock %q has no holders\n", pos[0])
	case *unsafeNow:
		fmt.Fprintf(c.env.stdout, "revoked %s; lock %q is free now (unsafe: old holders may still run)\n", printable(strings.Join(ids, ", ")), pos[0])
	default:
		fmt.Fprintf(c.env.stdout, "revoked %s; lock %q is granted again after their TTL + grace\n", printable(strings.Join(ids, ", ")), pos[0])
	}
	return nil
}

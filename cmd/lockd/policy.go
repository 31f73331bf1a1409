package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// RequestReleaseCommand is `lockd request-release NAME [--reason TEXT]`:
// ask a lock's holders to let go (docs/lock-semantics.md, "Asking a holder
// to let go").
type RequestReleaseCommand struct {
	env commandEnv
}

// Run asks the holders. It prints how many were asked and, for an admin's
// request on a lock whose policy has a revoke grace, the grace.
func (c *RequestReleaseCommand) Run(ctx context.Context, args []string) error {
	var reason *string
	pos, cf, err := c.env.parse("request-release", "lockd request-release NAME [--reason TEXT]", args, 1, 1, func(fs *flag.FlagSet) {
		reason = fs.String("reason", "", "why, for the holders and the watchers (at most 256 bytes)")
	})
	if err != nil {
		return err
	}
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	r, err := cl.RequestRelease(ctx, pos[0], *reason)
	if err != nil {
		return callError(fmt.Sprintf("request release of %q", pos[0]), err)
	}
	return writeReleaseRequest(c.env.stdout, pos[0], r)
}

// writeReleaseRequest prints what `lockd request-release` did.
func writeReleaseRequest(w io.Writer, name string, r lockd.RequestReleaseResult) error {
	switch {
	case r.Holders == 0:
		_, err := fmt.Fprintf(w, "lock %q has no holders: nobody asked\n", printable(name))
		return err
	case r.Holders == 1:
		fmt.Fprintf(w, "asked the holder of %q to let go\n", printable(name))
	default:
		fmt.Fprintf(w, "asked the %d holders of %q to let go\n", r.Holders, printable(name))
	}
	if r.RevokeGrace > 0 {
		_, err := fmt.Fprintf(w, "revoke grace %v: a holder that still holds it %v after an admin first asked has its session revoked\n", r.RevokeGrace, r.RevokeGrace)
		return err
	}
	return nil
}

// PolicyCommand is `lockd policy NAME [--max-hold D] [--revoke-grace D]
// [--clear]`: show or set a lock's policy (setting needs admin).
type PolicyCommand struct {
	env commandEnv
}

// Run prints the lock's policy, or sets it: the flags given replace their
// field (0 removes it), the others keep their current value; --clear
// removes the whole policy.
func (c *PolicyCommand) Run(ctx context.Context, args []string) error {
	var (
		fs                *flag.FlagSet
		maxHold, graceDur *time.Duration
		clear             *bool
	)
	pos, cf, err := c.env.parse("policy", "lockd policy NAME [--max-hold D] [--revoke-grace D] [--clear]", args, 1, 1, func(f *flag.FlagSet) {
		fs = f
		maxHold = f.Duration("max-hold", 0, "default hold budget of an acquire that asks none: 1s to 720h (0 removes it)")
		graceDur = f.Duration("revoke-grace", 0, "how long a holder an admin asked to let go (request-release) has before its session is revoked: 1s to 1h (0 removes it)")
		clear = f.Bool("clear", false, "remove the lock's policy")
	})
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *clear && (set["max-hold"] || set["revoke-grace"]) {
		return usageError{errors.New("policy: --clear removes the whole policy; give it alone")}
	}
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	name := pos[0]
	if *clear {
		if err := cl.SetLockPolicy(ctx, name, lockd.LockPolicy{}); err != nil {
			return callError(fmt.Sprintf("clear the policy of %q", name), err)
		}
		return writePolicy(c.env.stdout, name, lockd.LockPolicy{})
	}
	resp, err := cl.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
	if err != nil {
		return callError(fmt.Sprintf("read the policy of %q", name), err)
	}
	p := policyOf(resp.Msg.GetPolicy())
	if !set["max-hold"] && !set["revoke-grace"] {
		return writePolicy(c.env.stdout, name, p)
	}
	if set["max-hold"] {
		p.DefaultMaxHold = *maxHold
	}
	if set["revoke-grace"] {
		p.RevokeGrace = *graceDur
	}
	if err := cl.SetLockPolicy(ctx, name, p); err != nil {
		return callError(fmt.Sprintf("set the policy of %q", name), err)
	}
	return writePolicy(c.env.stdout, name, p)
}

// policyOf is an answer's lock policy (nil: the zero policy, none).
func policyOf(p *lockdv1.LockPolicy) lockd.LockPolicy {
	return lockd.LockPolicy{DefaultMaxHold: p.GetDefaultMaxHold().AsDuration(), RevokeGrace: p.GetRevokeGrace().AsDuration()}
}

// writePolicy prints a lock's policy (the zero policy: none).
func writePolicy(w io.Writer, name string, p lockd.LockPolicy) error {
	if p == (lockd.LockPolicy{}) {
		_, err := fmt.Fprintf(w, "lock %q has no policy\n", printable(name))
		return err
	}
	_, err := fmt.Fprintf(w, "policy of %q: %s\n", printable(name), policyString(p))
	return err
}

// policyString renders a lock's policy on one line.
func policyString(p lockd.LockPolicy) string {
	field := func(d time.Duration) string {
		if d <= 0 {
			return "none"
		}
		return d.String()
	}
	return fmt.Sprintf("default max hold %s, revoke grace %s", field(p.DefaultMaxHold), field(p.RevokeGrace))
}

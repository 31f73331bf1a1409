package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// DescribeCommand is `lockd describe NAME [--json]`: a lock's holders and
// its queue, in order.
type DescribeCommand struct {
	env commandEnv
}

// Run describes the lock. A lock that does not exist (free, nobody waiting)
// is not an error.
func (c *DescribeCommand) Run(ctx context.Context, args []string) error {
	var asJSON, stale *bool
	pos, cf, err := c.env.parse("describe", "lockd describe NAME [--json]", args, 1, 1, func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, "print the API's JSON (DescribeLockResponse)")
		stale = fs.Bool("stale", false, "read this node's state, possibly behind the leader")
	})
	if err != nil {
		return err
	}
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := cl.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{
		Name: pos[0], Consistency: consistency(*stale),
	}))
	if err != nil {
		return callError(fmt.Sprintf("describe %q", pos[0]), err)
	}
	if *asJSON {
		return printJSON(c.env.stdout, resp.Msg)
	}
	l := resp.Msg.GetLock()
	if l == nil {
		fmt.Fprintf(c.env.stdout, "lock %q is free, nobody waits\n", pos[0])
		return nil
	}
	if m := l.GetMark(); m != nil {
		fmt.Fprintf(c.env.stdout, "lock %q is done: completed by %s (session %s, token %d) at %s, mark kept %v\n",
			printable(l.GetName()), printable(m.GetOwner()), printable(m.GetSessionId()), m.GetToken(), m.GetCompletedAt().AsTime().UTC().Format(time.RFC3339), m.GetRetention().AsDuration())
		if d := delayString(l); d != "" {
			fmt.Fprintf(c.env.stdout, "lock-delay: %s\n", d)
		}
		fmt.Fprintf(c.env.stdout, "(admin: \"lockd mark clear %s --token %d\" ends the mark now)\n", printable(l.GetName()), m.GetToken())
		return nil
	}
	w := c.env.stdout
	fmt.Fprintf(w, "name:   %s\nlimit:  %s\n", printable(l.GetName()), limitString(l.GetLimit()))
	if d := delayString(l); d != "" {
		fmt.Fprintf(w, "lock-delay: %s\n", d)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "holders (%d):\n", len(l.GetHolders()))
	if len(l.GetHolders()) > 0 {
		fmt.Fprintln(tw, "  TOKEN\tMODE\tSESSION\tOWNER\tGRANTED\tVALUE")
		for _, h := range l.GetHolders() {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%q\n", h.GetToken(), modeName(h.GetMode()),
				printable(h.GetSessionId()), printable(h.GetOwner()), since(h.GetGrantedAt()), h.GetValue())
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "waiters (%d), first in line first:\n", len(l.GetWaiters()))
	if len(l.GetWaiters()) > 0 {
		fmt.Fprintln(tw, "  #\tMODE\tSESSION\tOWNER\tQUEUED")
		for i, q := range l.GetWaiters() {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", i+1, modeName(q.GetMode()),
				printable(q.GetSessionId()), printable(q.GetOwner()), since(q.GetQueuedAt()))
		}
		tw.Flush()
	}
	return nil
}

// delayString renders a lock's lock-delay, "" when it has none.
func delayString(l *lockdv1.LockInfo) string {
	d := l.GetLockDelay().AsDuration()
	if d <= 0 {
		return ""
	}
	if l.GetDelayed() {
		return fmt.Sprintf("%v, running: a holder expired, nothing is granted until it ends", d)
	}
	return fmt.Sprintf("%v after an expired holder", d)
}

// since renders a server timestamp (wall clock, for display) with its age.
func since(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	t := ts.AsTime().Local()
	return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), time.Since(t).Round(time.Second))
}

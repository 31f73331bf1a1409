package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// DescribeCommand is `lockd describe NAME [--json]`: a lock's holders and
// its queue, in order.
type DescribeCommand struct {
	env commandEnv
}

// Run describes the lock. A lock that does not exist (free, nobody waiting)
// is not an error.
func (c *DescribeCommand) Run(ctx context.Context, args []string) error {
	return readCommand[*lockdv1.DescribeLockResponse]{
		name: "describe", usage: "lockd describe NAME [--json]", minArgs: 1, maxArgs: 1,
		jsonHelp: "DescribeLockResponse", stale: true,
		call: func(ctx context.Context, svc lockdv1connect.LockServiceClient, pos []string, cons lockdv1.ReadConsistency) (*lockdv1.DescribeLockResponse, error) {
			resp, err := svc.DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: pos[0], Consistency: cons}))
			if err != nil {
				return nil, callError(fmt.Sprintf("describe %q", pos[0]), err)
			}
			return resp.Msg, nil
		},
		table: writeLock,
	}.run(ctx, c.env, args)
}

// writeLock prints `lockd describe NAME`: the lock's holders and its
// queue, or its completion mark, or that it is free.
func writeLock(w io.Writer, r *lockdv1.DescribeLockResponse, pos []string, now time.Time) error {
	l := r.GetLock()
	if l == nil {
		_, err := fmt.Fprintf(w, "lock %q is free, nobody waits\n", pos[0])
		return err
	}
	if m := l.GetMark(); m != nil {
		fmt.Fprintf(w, "lock %q is done: completed by %s (session %s, token %d) at %s, mark kept %v\n",
			printable(l.GetName()), printable(m.GetOwner()), printable(m.GetSessionId()), m.GetToken(), m.GetCompletedAt().AsTime().UTC().Format(time.RFC3339), m.GetRetention().AsDuration())
		if d := delayString(l); d != "" {
			fmt.Fprintf(w, "lock-delay: %s\n", d)
		}
		_, err := fmt.Fprintf(w, "(admin: \"lockd mark clear %s --token %d\" ends the mark now)\n", printable(l.GetName()), m.GetToken())
		return err
	}
	fmt.Fprintf(w, "name:   %s\nlimit:  %s\n", printable(l.GetName()), limitString(l.GetLimit()))
	if p := r.GetPolicy(); p != nil {
		fmt.Fprintf(w, "policy: %s\n", policyString(policyOf(p)))
	}
	if d := delayString(l); d != "" {
		fmt.Fprintf(w, "lock-delay: %s\n", d)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "holders (%d):\n", len(l.GetHolders()))
	if len(l.GetHolders()) > 0 {
		fmt.Fprintln(tw, "  TOKEN\tMODE\tSESSION\tOWNER\tGRANTED\tVALUE")
		for _, h := range l.GetHolders() {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%q\n", h.GetToken(), modeName(h.GetMode()),
				printable(h.GetSessionId()), printable(h.GetOwner()), since(h.GetGrantedAt(), now), h.GetValue())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if err := writeReleaseAsks(w, l.GetHolders(), now); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "waiters (%d), first in line first:\n", len(l.GetWaiters()))
	if len(l.GetWaiters()) > 0 {
		fmt.Fprintln(tw, "  #\tMODE\tSESSION\tOWNER\tQUEUED")
		for i, q := range l.GetWaiters() {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", i+1, modeName(q.GetMode()),
				printable(q.GetSessionId()), printable(q.GetOwner()), since(q.GetQueuedAt(), now))
		}
		return tw.Flush()
	}
	return nil
}

// writeReleaseAsks lists the holders asked to let go (RequestRelease):
// when first, why, and the revoke grace an admin's request started.
func writeReleaseAsks(w io.Writer, hs []*lockdv1.Holder, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	n := 0
	for _, h := range hs {
		if h.GetReleaseRequestedAt() == nil {
			continue
		}
		if n++; n == 1 {
			fmt.Fprintln(w, "asked to let go:")
			fmt.Fprintln(tw, "  TOKEN\tASKED\tREVOKE GRACE\tREASON")
		}
		grace := "none (only asked)"
		if g := h.GetRevokeGrace(); g != nil {
			grace = g.AsDuration().String()
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%q\n", h.GetToken(), since(h.GetReleaseRequestedAt(), now), grace, h.GetReleaseReason())
	}
	return tw.Flush()
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

// since renders a server timestamp (wall clock, for display) with its age
// at now, in now's time zone (the local one, outside tests).
func since(ts *timestamppb.Timestamp, now time.Time) string {
	if ts == nil {
		return "-"
	}
	t := ts.AsTime().In(now.Location())
	return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), now.Sub(t).Round(time.Second))
}

package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// ExplainCommand is `lockd explain NAME [--json]`: describe, plus the chain
// of what each holder itself waits for, across locks.
type ExplainCommand struct {
	env commandEnv
}

// Run explains the lock.
func (c *ExplainCommand) Run(ctx context.Context, args []string) error {
	return readCommand[*lockdv1.ExplainResponse]{
		name: "explain", usage: "lockd explain NAME [--json]", minArgs: 1, maxArgs: 1,
		jsonHelp: "ExplainResponse", stale: true,
		call: func(ctx context.Context, svc lockdv1connect.LockServiceClient, pos []string, cons lockdv1.ReadConsistency) (*lockdv1.ExplainResponse, error) {
			resp, err := svc.Explain(ctx, connect.NewRequest(&lockdv1.ExplainRequest{Name: pos[0], Consistency: cons}))
			if err != nil {
				return nil, callError(fmt.Sprintf("explain %q", pos[0]), err)
			}
			return resp.Msg, nil
		},
		table: writeExplain,
	}.run(ctx, c.env, args)
}

// writeExplain prints `lockd explain NAME`: the lock as describe prints it,
// then one line per link of the holders' chain of waits, indented by depth.
func writeExplain(w io.Writer, r *lockdv1.ExplainResponse, pos []string, now time.Time) error {
	if err := writeLock(w, &lockdv1.DescribeLockResponse{Lock: r.GetLock()}, pos, now); err != nil || r.GetLock() == nil {
		return err
	}
	if len(r.GetChain()) == 0 {
		_, err := fmt.Fprintln(w, "the holders wait for nothing")
		return err
	}
	fmt.Fprintln(w, "what the holders wait for:")
	for _, st := range r.GetChain() {
		how := "queued before it"
		if st.GetHolding() {
			how = "holding it"
		}
		cycle := ""
		if st.GetCycle() {
			cycle = "  <- cycle: deadlock"
		}
		fmt.Fprintf(w, "%s%s (%s) waits for %q since %s: %s (%s) %s%s\n", strings.Repeat("  ", int(st.GetDepth())),
			printable(st.GetSessionId()), printable(st.GetOwner()), printable(st.GetLock()), since(st.GetQueuedAt(), now),
			printable(st.GetBlockedBy()), printable(st.GetBlockedByOwner()), how, cycle)
	}
	if r.GetTruncated() {
		fmt.Fprintln(w, "(cut at 1000 steps)")
	}
	return nil
}

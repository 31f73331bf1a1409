package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// SessionsCommand is `lockd sessions [--json]`: the live sessions.
type SessionsCommand struct {
	env commandEnv
}

// Run lists the sessions.
func (c *SessionsCommand) Run(ctx context.Context, args []string) error {
	return readCommand[*lockdv1.ListSessionsResponse]{
		name: "sessions", usage: "lockd sessions [--json]",
		jsonHelp: "ListSessionsResponse", stale: true,
		call: func(ctx context.Context, svc lockdv1connect.LockServiceClient, _ []string, cons lockdv1.ReadConsistency) (*lockdv1.ListSessionsResponse, error) {
			resp, err := svc.ListSessions(ctx, connect.NewRequest(&lockdv1.ListSessionsRequest{Consistency: cons}))
			if err != nil {
				return nil, callError("list sessions", err)
			}
			return resp.Msg, nil
		},
		table: writeSessions,
	}.run(ctx, c.env, args)
}

// writeSessions prints `lockd sessions`'s table; nothing when there are none.
func writeSessions(w io.Writer, r *lockdv1.ListSessionsResponse, _ []string, now time.Time) error {
	if len(r.GetSessions()) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tOWNER\tTTL\tHOLDS\tWAITS\tCREATED\tREVOKED")
	for _, s := range r.GetSessions() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%v\n", printable(s.GetSessionId()), printable(s.GetOwner()),
			s.GetTtl().AsDuration(), s.GetHolds(), s.GetWaits(), since(s.GetCreatedAt(), now), s.GetRevoked())
	}
	return tw.Flush()
}

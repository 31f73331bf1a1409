package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// SessionsCommand is `lockd sessions [--json]`: the live sessions.
type SessionsCommand struct {
	env commandEnv
}

// Run lists the sessions.
func (c *SessionsCommand) Run(ctx context.Context, args []string) error {
	fs := newFlagSet("sessions", c.env.stderr)
	var cf clientFlags
	cf.register(fs, c.env.getenv)
	cf.registerTimeout(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON (ListSessionsResponse)")
	stale := fs.Bool("stale", false, "read this node's state, possibly behind the leader")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(pos, 0, 0, "lockd sessions [--json]"); err != nil {
		return err
	}
	cl, err := cf.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()
	resp, err := cl.Service().ListSessions(ctx, connect.NewRequest(&lockdv1.ListSessionsRequest{Consistency: consistency(*stale)}))
	if err != nil {
		return callError("list sessions", err)
	}
	if *asJSON {
		return printJSON(c.env.stdout, resp.Msg)
	}
	if len(resp.Msg.GetSessions()) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tOWNER\tTTL\tHOLDS\tWAITS\tCREATED\tREVOKED")
	for _, s := range resp.Msg.GetSessions() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%v\n", s.GetSessionId(), s.GetOwner(),
			s.GetTtl().AsDuration(), s.GetHolds(), s.GetWaits(), since(s.GetCreatedAt()), s.GetRevoked())
	}
	return tw.Flush()
}

package main

import (
	"context"
	"flag"
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
	var asJSON, stale *bool
	_, cf, err := c.env.parse("sessions", "lockd sessions [--json]", args, 0, 0, func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, "print the API's JSON (ListSessionsResponse)")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%v\n", printable(s.GetSessionId()), printable(s.GetOwner()),
			s.GetTtl().AsDuration(), s.GetHolds(), s.GetWaits(), since(s.GetCreatedAt()), s.GetRevoked())
	}
	return tw.Flush()
}

package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// LsCommand is `lockd ls [PREFIX] [--json]`: list locks by name prefix.
type LsCommand struct {
	env commandEnv
}

// Run lists every lock whose name starts with PREFIX, in name order,
// following the pages to the end.
func (c *LsCommand) Run(ctx context.Context, args []string) error {
	var asJSON, stale *bool
	pos, cf, err := c.env.parse("ls", "lockd ls [PREFIX] [--json]", args, 0, 1, func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, "print the API's JSON (ListLocksResponse)")
		stale = fs.Bool("stale", false, "read this node's state, possibly behind the leader")
	})
	if err != nil {
		return err
	}
	prefix := ""
	if len(pos) == 1 {
		prefix = pos[0]
	}
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	all := &lockdv1.ListLocksResponse{}
	req := &lockdv1.ListLocksRequest{Prefix: prefix, PageSize: 1000, Consistency: consistency(*stale)}
	for {
		resp, err := cl.Service().ListLocks(ctx, connect.NewRequest(req))
		if err != nil {
			return callError("list locks", err)
		}
		all.Locks = append(all.Locks, resp.Msg.GetLocks()...)
		if resp.Msg.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.Msg.GetNextPageToken()
	}
	if *asJSON {
		return printJSON(c.env.stdout, all)
	}
	if len(all.Locks) == 0 {
		// An empty table would look like a hang or a failure to a person;
		// scripts read --json, which stays an empty list.
		if prefix == "" {
			_, err := fmt.Fprintln(c.env.stdout, "no locks")
			return err
		}
		_, err := fmt.Fprintf(c.env.stdout, "no locks with prefix %q\n", prefix)
		return err
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tLIMIT\tHOLDERS\tWAITERS\tTOKENS")
	for _, l := range all.Locks {
		var tokens []string
		for _, h := range l.GetHolders() {
			tokens = append(tokens, fmt.Sprint(h.GetToken()))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", printable(l.GetName()), limitString(l.GetLimit()),
			len(l.GetHolders()), len(l.GetWaiters()), strings.Join(tokens, ","))
	}
	return tw.Flush()
}

func limitString(n uint32) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

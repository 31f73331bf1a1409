package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// LsCommand is `lockd ls [PREFIX] [--json]`: list locks by name prefix.
type LsCommand struct {
	env commandEnv
}

// Run lists every lock whose name starts with PREFIX, in name order,
// following the pages to the end.
func (c *LsCommand) Run(ctx context.Context, args []string) error {
	return readCommand[*lockdv1.ListLocksResponse]{
		name: "ls", usage: "lockd ls [PREFIX] [--json]", minArgs: 0, maxArgs: 1,
		jsonHelp: "ListLocksResponse", stale: true,
		call:  listLocks,
		table: writeLocks,
	}.run(ctx, c.env, args)
}

// listLocks reads every lock under the prefix in pos, all pages.
func listLocks(ctx context.Context, svc lockdv1connect.LockServiceClient, pos []string, cons lockdv1.ReadConsistency) (*lockdv1.ListLocksResponse, error) {
	all := &lockdv1.ListLocksResponse{}
	req := &lockdv1.ListLocksRequest{Prefix: lsPrefix(pos), PageSize: 1000, Consistency: cons}
	for {
		resp, err := svc.ListLocks(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, callError("list locks", err)
		}
		all.Locks = append(all.Locks, resp.Msg.GetLocks()...)
		if resp.Msg.GetNextPageToken() == "" {
			return all, nil
		}
		req.PageToken = resp.Msg.GetNextPageToken()
	}
}

func lsPrefix(pos []string) string {
	if len(pos) == 1 {
		return pos[0]
	}
	return ""
}

// writeLocks prints `lockd ls`'s table.
func writeLocks(w io.Writer, all *lockdv1.ListLocksResponse, pos []string, _ time.Time) error {
	if len(all.GetLocks()) == 0 {
		// An empty table would look like a hang or a failure to a person;
		// scripts read --json, which stays an empty list.
		if prefix := lsPrefix(pos); prefix != "" {
			_, err := fmt.Fprintf(w, "no locks with prefix %q\n", prefix)
			return err
		}
		_, err := fmt.Fprintln(w, "no locks")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tLIMIT\tHOLDERS\tWAITERS\tTOKENS")
	for _, l := range all.GetLocks() {
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

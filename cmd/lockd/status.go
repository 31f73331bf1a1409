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

// StatusCommand is `lockd status [--json]`: the node answering and the
// cluster as it sees it.
type StatusCommand struct {
	env commandEnv
}

// Run prints the status of the first endpoint that answers.
func (c *StatusCommand) Run(ctx context.Context, args []string) error {
	return readCommand[*lockdv1.StatusResponse]{
		name: "status", usage: "lockd status [--json]",
		jsonHelp: "StatusResponse",
		call: func(ctx context.Context, svc lockdv1connect.LockServiceClient, _ []string, _ lockdv1.ReadConsistency) (*lockdv1.StatusResponse, error) {
			resp, err := svc.Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
			if err != nil {
				return nil, callError("status", err)
			}
			return resp.Msg, nil
		},
		table: writeStatus,
	}.run(ctx, c.env, args)
}

// writeStatus prints `lockd status`: the answering node, then the members.
func writeStatus(w io.Writer, s *lockdv1.StatusResponse, _ []string, _ time.Time) error {
	leader := s.GetLeader()
	if leader == "" {
		leader = "(none)"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "node:\t%s (%s)\n", printable(s.GetNodeId()), printable(s.GetState()))
	fmt.Fprintf(tw, "leader:\t%s\n", printable(leader))
	fmt.Fprintf(tw, "cluster:\t%s\n", printable(s.GetClusterId()))
	fmt.Fprintf(tw, "term:\t%d\n", s.GetTerm())
	fmt.Fprintf(tw, "commit index:\t%d\n", s.GetCommitIndex())
	fmt.Fprintf(tw, "applied index:\t%d\n", s.GetAppliedIndex())
	fmt.Fprintf(tw, "sessions:\t%d\n", s.GetSessions())
	fmt.Fprintf(tw, "locks:\t%d\n", s.GetLocks())
	fmt.Fprintf(tw, "last token:\t%d\n", s.GetLastToken())
	fmt.Fprintf(tw, "version:\t%s\n", printable(s.GetVersion()))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.GetMembers()) == 0 {
		return nil
	}
	fmt.Fprintln(w, "members:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tROLE\tVOTER\tAPI\tRAFT")
	for _, m := range s.GetMembers() {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", printable(m.GetId()), printable(m.GetRole()), yesNo(m.GetVoter()), printable(m.GetApi()), printable(m.GetRaft()))
	}
	return tw.Flush()
}

// yesNo spells a flag in a table the way `lockd members` does.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

const leaderUsage = "lockd leader transfer [ID]"

// LeaderCommand is `lockd leader transfer [ID]`: hand leadership to another
// voter (ID, or any caught-up one).
type LeaderCommand struct {
	env commandEnv
}

// leaderFlags is a parsed `lockd leader` command line.
type leaderFlags struct {
	client clientFlags
	to     string // "" for any voter
}

func (c *LeaderCommand) parse(args []string) (*leaderFlags, error) {
	f := &leaderFlags{}
	fs := newFlagSet("leader", c.env.stderr)
	f.client.register(fs, c.env.getenv)
	f.client.registerTimeout(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) == 0 || pos[0] != "transfer" {
		if len(pos) > 0 {
			return nil, usageError{fmt.Errorf("unknown argument %q; usage: %s", pos[0], leaderUsage)}
		}
		return nil, usageError{errors.New("usage: " + leaderUsage)}
	}
	if err := wantArgs(pos, 1, 2, leaderUsage); err != nil {
		return nil, err
	}
	if len(pos) == 2 {
		if f.to = strings.TrimSpace(pos[1]); f.to == "" {
			return nil, usageError{errors.New("usage: " + leaderUsage + ": the node id must not be empty")}
		}
	}
	return f, nil
}

// Run transfers leadership and prints the new leader.
func (c *LeaderCommand) Run(ctx context.Context, args []string) error {
	f, err := c.parse(args)
	if err != nil {
		return err
	}
	ctx, cl, done, err := f.client.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	st, err := cl.Service().Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
	if err != nil {
		return callError("status", err)
	}
	old := st.Msg.GetLeader()
	what := "leader transfer"
	if f.to != "" {
		what = fmt.Sprintf("leader transfer to %q", f.to)
		if f.to == old {
			fmt.Fprintf(c.env.stdout, "%s is the leader already\n", printable(old))
			return nil
		}
	}
	// Not retried after an unknown outcome (the client's policy table):
	// leadership may have moved already, and a second transfer would move
	// it again.
	resp, err := cl.ClusterService().TransferLeadership(ctx, connect.NewRequest(&lockdv1.TransferLeadershipRequest{NodeId: f.to}))
	if err != nil {
		if errors.Is(err, lockd.ErrUnavailable) {
			err = fmt.Errorf("%w (the transfer may have happened: check lockd members)", err)
		}
		return callError(what, err)
	}
	// The old leader answers as soon as it stepped down, often before it
	// heard from its successor: ask the cluster for a moment.
	leader := resp.Msg.GetLeader()
	if leader == "" || leader == old {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		leader = leaderOf(wctx, cl, old)
		wcancel()
	}
	switch {
	case leader == "":
		fmt.Fprintf(c.env.stdout, "leadership transferred from %s; no new leader known yet\n", printable(nonEmpty(old)))
	default:
		fmt.Fprintf(c.env.stdout, "leadership transferred from %s to %s\n", printable(nonEmpty(old)), printable(leader))
	}
	return nil
}

func nonEmpty(id string) string {
	if id == "" {
		return "(none)"
	}
	return id
}

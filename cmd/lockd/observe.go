package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/lockd-dev/lockd"
)

// ObserveCommand is `lockd observe NAME [--json]`: print the leader of
// election NAME now and at each change, until interrupted.
type ObserveCommand struct {
	env commandEnv
}

// observed is one line of `lockd observe --json`.
type observed struct {
	Leader  bool   `json:"leader"`
	Session string `json:"session,omitempty"`
	Owner   string `json:"owner,omitempty"`
	Token   uint64 `json:"token,omitempty"`
	Value   string `json:"value,omitempty"`
}

// Run prints one line per change: "leader token=… session=… owner=…
// value=…" or "no leader" (with --json, one object a line).
func (c *ObserveCommand) Run(ctx context.Context, args []string) error {
	var asJSON *bool
	pos, cf, err := c.env.parse("observe", "lockd observe NAME [--json]", args, 1, 1, func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, `print each change as one line of JSON: {"leader":true,"session":…,"owner":…,"token":…,"value":…}`)
	})
	if err != nil {
		return err
	}
	cl, err := cf.client()
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	for l, err := range cl.ObserveElection(ctx, pos[0]) {
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted: the normal end
			}
			if errors.Is(err, lockd.ErrInvalidArgument) {
				return usageError{err}
			}
			return callError("observe", err)
		}
		if *asJSON {
			b, err := json.Marshal(observed{Leader: l.Token != 0, Session: l.SessionID, Owner: l.Owner, Token: l.Token, Value: string(l.Value)})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.env.stdout, "%s\n", escapeJSON(b))
			if err != nil {
				return err
			}
			continue
		}
		if _, err := io.WriteString(c.env.stdout, leaderLine(l)); err != nil {
			return err
		}
	}
	return nil
}

// leaderLine is observe's line for one change of leader.
func leaderLine(l lockd.Leader) string {
	if l.Token == 0 {
		return "no leader\n"
	}
	return fmt.Sprintf("leader\ttoken=%d\tsession=%s\towner=%s\tvalue=%q\n", l.Token, printable(l.SessionID), printable(l.Owner), l.Value)
}

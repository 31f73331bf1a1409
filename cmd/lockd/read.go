package main

import (
	"context"
	"flag"
	"io"
	"time"

	"google.golang.org/protobuf/proto"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// readCommand is a read command (ls, describe, sessions, status): its
// usage, its arguments, the one call it makes and the table it prints.
// run does the rest the same way for each: the client flags, --json and,
// where the API offers it, --stale; connecting; then the API's JSON or the
// table. The table is a function of the answer and the time alone, so the
// golden tests render it from fixed answers.
type readCommand[R proto.Message] struct {
	name, usage      string
	minArgs, maxArgs int
	// jsonHelp names the message --json prints.
	jsonHelp string
	// stale offers --stale: a read of the answering node's state.
	stale bool
	// call asks the cluster; its error is already worded for the user.
	call func(ctx context.Context, svc lockdv1connect.LockServiceClient, pos []string, c lockdv1.ReadConsistency) (R, error)
	// table prints the answer for a person.
	table func(w io.Writer, r R, pos []string, now time.Time) error
}

// run parses args, makes the call and prints its answer on env's stdout.
func (rc readCommand[R]) run(ctx context.Context, env commandEnv, args []string) error {
	var asJSON, stale *bool
	pos, cf, err := env.parse(rc.name, rc.usage, args, rc.minArgs, rc.maxArgs, func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, "print the API's JSON ("+rc.jsonHelp+")")
		if rc.stale {
			stale = fs.Bool("stale", false, "read this node's state, possibly behind the leader")
		}
	})
	if err != nil {
		return err
	}
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := rc.call(ctx, cl.Service(), pos, consistency(stale != nil && *stale))
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(env.stdout, resp)
	}
	return rc.table(env.stdout, resp, pos, time.Now())
}

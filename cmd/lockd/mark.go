package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"connectrpc.com/connect"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// MarkCommand is `lockd mark clear NAME [--token T] [--json]`: an admin
// operation that ends a lock's completion mark before its retention runs
// out, so that the job it marks done can run again (a wrong or failed run
// that was completed anyway, a test, a re-run on purpose).
type MarkCommand struct {
	env commandEnv
}

const markUsage = "lockd mark clear NAME [--token T] [--json]"

// Run clears the mark. A lock without a mark (or whose mark has another
// token than --token) is not an error: there is nothing to clear.
func (c *MarkCommand) Run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "clear" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprintf(c.env.stderr, "Usage: %s\n", markUsage)
			return flag.ErrHelp
		}
		return usageError{fmt.Errorf("usage: %s", markUsage)}
	}
	var token *uint64
	var asJSON *bool
	pos, cf, err := c.env.parse("mark clear", markUsage, args[1:], 1, 1, func(fs *flag.FlagSet) {
		token = fs.Uint64("token", 0, "clear the mark only if it was made with this token (see lockd describe); then a retry is safe")
		asJSON = fs.Bool("json", false, "print the API's JSON (ClearMarkResponse)")
	})
	if err != nil {
		return err
	}
	ctx, cl, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := cl.Service().ClearMark(ctx, connect.NewRequest(&lockdv1.ClearMarkRequest{Name: pos[0], Token: *token}))
	if err != nil {
		return callError(fmt.Sprintf("clear mark of %q", pos[0]), err)
	}
	if *asJSON {
		return printJSON(c.env.stdout, resp.Msg)
	}
	m := resp.Msg.GetMark()
	switch {
	case m == nil && *token != 0:
		fmt.Fprintf(c.env.stdout, "lock %q has no mark with token %d\n", pos[0], *token)
	case m == nil:
		fmt.Fprintf(c.env.stdout, "lock %q has no completion mark\n", pos[0])
	default:
		fmt.Fprintf(c.env.stdout, "cleared the mark of %q (completed by %s, token %d, at %s); the next acquire is granted\n",
			pos[0], printable(m.GetOwner()), m.GetToken(), m.GetCompletedAt().AsTime().UTC().Format(time.RFC3339))
	}
	return nil
}

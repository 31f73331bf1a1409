package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// WatchCommand is `lockd watch [PREFIX] [--json] [--from POS]`: print lock
// events as they happen, until interrupted.
type WatchCommand struct {
	env commandEnv
}

// Run prints every event of the locks under PREFIX, one line each (with
// --json, one WatchResponse object a line). It reconnects by itself; a
// reset (events lost) is printed as a RESET line and the watch goes on.
func (c *WatchCommand) Run(ctx context.Context, args []string) error {
	var asJSON *bool
	var from *string
	pos, cf, err := c.env.parse("watch", "lockd watch [PREFIX] [--json] [--from POS]", args, 0, 1, func(fs *flag.FlagSet) {
		asJSON = fs.Bool("json", false, "print each event as one line of JSON (WatchResponse)")
		from = fs.String("from", "", "resume after this position (an event's position); default: from now")
	})
	if err != nil {
		return err
	}
	prefix := ""
	if len(pos) == 1 {
		prefix = pos[0]
	}
	cl, err := cf.client()
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	var opts []lockd.WatchOption
	if *from != "" {
		opts = append(opts, lockd.WatchFrom(*from))
	}
	for ev, err := range cl.Watch(ctx, prefix, opts...) {
		if err != nil && !errors.Is(err, lockd.ErrWatchReset) {
			if errors.Is(err, lockd.ErrInvalidArgument) {
				return usageError{err}
			}
			if ctx.Err() != nil {
				return nil // interrupted: the normal end
			}
			return callError("watch", err)
		}
		if *asJSON {
			err = printEventJSON(c.env, ev)
		} else {
			err = printEvent(c.env, ev)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func printEvent(env commandEnv, ev lockd.Event) error {
	if ev.Kind == lockd.EventReset {
		_, err := fmt.Fprintf(env.stdout, "%s\tRESET\tevents were lost: re-list the locks (lockd ls); the watch goes on\n", printable(ev.Position))
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\t%s\t%s", printable(ev.Position), ev.Kind, printable(ev.Name))
	if ev.Token != 0 {
		fmt.Fprintf(&b, "\ttoken=%d", ev.Token)
	}
	if ev.Session != "" {
		fmt.Fprintf(&b, "\tsession=%s", printable(ev.Session))
	}
	if ev.Owner != "" {
		fmt.Fprintf(&b, "\towner=%s", printable(ev.Owner))
	}
	if ev.Shared {
		b.WriteString("\tshared")
	}
	if len(ev.Value) > 0 {
		fmt.Fprintf(&b, "\tvalue=%q", ev.Value)
	}
	b.WriteByte('\n')
	_, err := fmt.Fprint(env.stdout, b.String())
	return err
}

func printEventJSON(env commandEnv, ev lockd.Event) error {
	mode := lockdv1.Mode_MODE_EXCLUSIVE
	if ev.Shared {
		mode = lockdv1.Mode_MODE_SHARED
	}
	if ev.Kind == lockd.EventReset || ev.Kind == lockd.EventDelayEnded {
		mode = lockdv1.Mode_MODE_UNSPECIFIED
	}
	m := &lockdv1.WatchResponse{Position: ev.Position, Kind: lockdv1.EventKind(ev.Kind), Name: ev.Name, Session: ev.Session,
		Owner: ev.Owner, Token: ev.Token, Mode: mode, Limit: ev.Limit, Value: ev.Value, EntryEnd: ev.EntryEnd}
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, escapeJSON(b)); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = env.stdout.Write(out.Bytes())
	return err
}

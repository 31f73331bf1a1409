package main

import "context"

const electUsage = "lockd elect [--endpoints URLS] [--ttl D] [--wait D | --no-wait] [--max-hold D] [--kill-grace D] [--conflict-exit-code N] [--lock-delay D] NAME VALUE -- CMD [ARGS...]"

const electHelpHead = `Usage:

	lockd elect [flags] NAME VALUE -- CMD [ARGS...]

Campaign in election NAME announcing VALUE, and run CMD only while this
process is the leader: it waits in line (FIFO) until elected, then runs CMD
exactly as "lockd run NAME -- CMD" does (the leader holds the election's
exclusive lock; same supervisor, environment, signals and exit statuses).
Leadership passes to the next candidate when CMD ends or the lease is lost.
"lockd observe NAME" prints each change of leader.

Flags:

`

// ElectCommand is `lockd elect NAME VALUE -- CMD`: run CMD only while
// leader of election NAME. It is lockd run with the election's value.
type ElectCommand struct {
	run RunCommand
}

// Run campaigns, runs the command while leader and returns lockd run's
// exit statuses.
func (c *ElectCommand) Run(ctx context.Context, args []string) error {
	c.run.elect = true
	return c.run.Run(ctx, args)
}

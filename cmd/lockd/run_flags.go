package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/lockd-dev/lockd"
)

// runFlags are lockd run's flags, after validation.
type runFlags struct {
	client           clientFlags
	ttl              time.Duration
	wait             time.Duration // with waitSet; 0 = try once
	waitSet          bool
	limit            uint
	limitSet         bool
	shared           bool
	maxHold          time.Duration
	killGrace        time.Duration
	killGraceSet     bool
	conflictExitCode int
	once             time.Duration // --once: complete instead of release after exit 0
	lockDelay        time.Duration
	name             string
	locks            []string // --lock, repeated: a set taken all at once (NAME is then not given)
	value            []byte   // lockd elect: the value announced while leader
	command          []string
	redis            []string // --backend: Redis URLs; none means lockd
	onRevoke         string   // --on-revoke: ignore or term (run_revoke.go)
	noWait           bool     // --no-wait, settled into wait by check
	killGraceText    string   // --kill-grace as given, settled into killGrace by check
}

const runUsage = "lockd run [--endpoints URLS | --backend redis://HOST:PORT] [--ttl D] [--wait D | --no-wait] [--limit N] [--shared] [--max-hold D] [--kill-grace D] [--conflict-exit-code N] [--once D] [--lock-delay D] [--on-revoke ignore|term] NAME -- CMD [ARGS...]"

// runHelpHead and runHelpTail are what `lockd run -h` prints around the flags: the synopsis, what
// the command does, and its exit statuses, which scripts rely on.
const runHelpHead = `Usage:

	lockd run [flags] NAME -- CMD [ARGS...]

Run CMD while holding lock NAME (exclusive by default). Waits in the
server's FIFO queue until granted, unless --wait or --no-wait says
otherwise. CMD runs in its own process group under a supervisor, with
LOCKD_LOCK, LOCKD_TOKEN (the fencing token, decimal) and LOCKD_SESSION in
its environment. When the lease is in jeopardy the group gets SIGTERM at
deadline - kill-grace and SIGKILL by the deadline, even if lockd run itself
is killed or stopped. SIGINT, SIGTERM and SIGHUP are forwarded to CMD. The
lock is released once every process of CMD is gone.

Flags:

`

const runHelpTail = `
Exit status:

	CMD's own  CMD ran to its end (128+n when killed by signal n);
	           0 also with --once when the job was already done
	75         lock not obtained: busy, --wait ran out, or the job is marked
	           done (without --once); --conflict-exit-code changes it
	69         no endpoint reachable, or no leader, until the wait ended
	71         lockd stopped CMD: lease lost or in jeopardy, --max-hold ran
	           out, or its supervisor died
	64         usage error, or a request the server refused as invalid
	126, 127   CMD could not be run / was not found
	130, 143   interrupted while waiting for the lock, by SIGINT (Ctrl-C) or
	           SIGTERM (128+n for signal n; 129 for SIGHUP); CMD did not run
	1          any other error

Every status that is not CMD's own prints one line on stderr saying why.
`

// printRunHelp writes the help of lockd run to w.
func printRunHelp(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, runHelpHead)
	fs.PrintDefaults()
	fmt.Fprint(w, runBackendsHelp)
	fmt.Fprint(w, runHelpTail)
}

// parse reads lockd run's arguments. -h prints the help on c.Stderr; a bad
// flag is only returned, for Main to print once.
func (c *RunCommand) parse(args []string) (_ *runFlags, err error) {
	var f runFlags
	fs := newFlagSet("run", io.Discard)
	fs.Usage = func() {}
	defer func() {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(c.Stderr)
			if c.elect {
				fmt.Fprint(c.Stderr, electHelpHead)
				fs.PrintDefaults()
				fmt.Fprint(c.Stderr, runHelpTail)
				return
			}
			printRunHelp(c.Stderr, fs)
		}
	}()
	f.register(fs, c.Getenv)
	pos, command, err := splitRunArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if c.elect {
		// lockd elect NAME VALUE -- CMD: the "--" is required, since
		// VALUE could look like a command.
		if len(pos) != 2 || len(command) == 0 || f.limitSet || f.shared || f.once > 0 {
			return nil, usageError{fmt.Errorf("usage: %s", electUsage)}
		}
		pos, f.value = pos[:1], []byte(pos[1])
		if len(f.redis) > 0 {
			// Observe, Proclaim and the leader's value live in lockd's
			// watch; a Redis lock would carry none of them.
			return nil, usageError{errors.New("lockd elect runs on lockd only: --backend is not supported")}
		}
	}
	if len(f.locks) > 0 && !c.elect {
		// lockd run --lock A --lock B -- CMD: the set names the locks.
		if len(pos) != 0 || len(command) == 0 {
			return nil, usageError{fmt.Errorf("usage: %s (with --lock, no NAME, and CMD after --)", runUsage)}
		}
		pos = []string{strings.Join(f.locks, ",")}
	}
	if len(pos) != 1 || len(command) == 0 {
		return nil, usageError{fmt.Errorf("usage: %s", runUsage)}
	}
	f.name, f.command = pos[0], command
	if err := f.check(); err != nil {
		return nil, usageError{err}
	}
	return &f, nil
}

// register defines lockd run's flags on fs, to be parsed into f.
func (f *runFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	f.client.register(fs, getenv)
	fs.DurationVar(&f.ttl, "ttl", lockd.DefaultTTL, "session lease TTL (1s to 1h)")
	fs.Func("wait", "wait at most this long for the lock (default: until granted; 0: try once)", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return fmt.Errorf("want a duration of 0 or more, like 30s")
		}
		f.wait, f.waitSet = d, true
		return nil
	})
	fs.BoolVar(&f.noWait, "no-wait", false, "try once; do not wait (same as --wait 0)")
	fs.Func("limit", "take one of N permits of a semaphore instead of an exclusive lock", func(s string) error {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("want a number of permits of 1 or more")
		}
		f.limit, f.limitSet = uint(n), true
		return nil
	})
	fs.BoolVar(&f.shared, "shared", false, "take a shared (read) lock; exclusive (write) holders wait for all readers")
	fs.DurationVar(&f.maxHold, "max-hold", 0, "end the command after this long: SIGTERM, then SIGKILL after --kill-grace; on lockd, 1s or more is also the hold's budget on the server (0: no limit)")
	fs.StringVar(&f.killGraceText, "kill-grace", "", "time between SIGTERM and SIGKILL, and how long before the lease deadline SIGTERM is sent (default min(2s, TTL/4))")
	fs.IntVar(&f.conflictExitCode, "conflict-exit-code", exitConflict, "exit status when the lock is not obtained")
	fs.DurationVar(&f.lockDelay, "lock-delay", 0, "when this run creates the lock: after a holder's session expires (not a clean release), grant it to nobody for this long (at most 1h)")
	fs.Func("backend", "lock on Redis instead of lockd: redis://HOST:PORT, or several (comma-separated or repeated) for Redlock; see Backends below", f.addBackend)
	fs.Func("lock", "take this lock too, all at once with every other --lock (repeat it; 2 to 32 locks, exclusive, lockd only; no NAME then, and CMD after --); the command gets LOCKD_TOKENS=NAME=TOKEN,…", func(s string) error {
		f.locks = append(f.locks, s)
		return nil
	})
	fs.StringVar(&f.onRevoke, "on-revoke", onRevokeIgnore, "when someone asks for the lock (lockd request-release): ignore (only log it on stderr) or term (log it and send SIGTERM to CMD, whose exit releases the lock)")
	fs.DurationVar(&f.once, "once", 0, "run at most once within this time across all servers: after CMD exits 0 the lock is marked done (kept D); a later run exits 0 at once without running CMD (exclusive locks only)")
}

// splitRunArgs parses fs's flags out of args and splits the rest into the
// positional arguments and the command. Everything after the first "--" is
// the command; without one, the command starts at the second positional
// argument (flags, NAME, flags, then CMD with its own flags untouched).
func splitRunArgs(fs *flag.FlagSet, args []string) (pos, command []string, err error) {
	flagArgs := args
	for i, a := range args {
		if a == "--" {
			flagArgs, command = args[:i], args[i+1:]
			break
		}
	}
	if command != nil {
		pos, err = parseArgs(fs, flagArgs)
		return pos, command, err
	}
	for len(flagArgs) > 0 && len(pos) < 2 {
		if err := fs.Parse(flagArgs); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, err
			}
			return nil, nil, usageError{err}
		}
		flagArgs = fs.Args()
		if len(flagArgs) > 0 {
			pos = append(pos, flagArgs[0])
			flagArgs = flagArgs[1:]
		}
	}
	if len(pos) == 2 {
		command = append([]string{pos[1]}, flagArgs...)
		pos = pos[:1]
	}
	return pos, command, nil
}

// check validates the parsed flags together and settles --no-wait and
// --kill-grace.
func (f *runFlags) check() error {
	if f.noWait {
		if f.waitSet && f.wait != 0 {
			return errors.New("--no-wait and --wait cannot be used together")
		}
		f.wait, f.waitSet = 0, true
	}
	switch {
	case f.shared && f.limitSet:
		return errors.New("--shared and --limit cannot be used together: --limit N takes one of N shared permits")
	case f.once < 0 || f.once > 0 && f.once < time.Second:
		return fmt.Errorf("--once %v: want a retention of 1s or more", f.once)
	case f.lockDelay < 0 || f.lockDelay > time.Hour || f.lockDelay > 0 && f.lockDelay < time.Millisecond:
		return fmt.Errorf("--lock-delay %v: want 0, or 1ms to 1h", f.lockDelay)
	case f.once > 0 && (f.shared || f.limitSet):
		return errors.New("--once needs an exclusive lock: it cannot be used with --shared or --limit")
	case f.ttl <= 0:
		return fmt.Errorf("--ttl %v must be positive", f.ttl)
	case len(f.locks) == 1 || len(f.locks) > 32:
		return fmt.Errorf("--lock given %d times: a set takes 2 to 32 locks (for one lock, give NAME)", len(f.locks))
	case len(f.locks) > 0 && (f.shared || f.limitSet || f.once > 0 || f.lockDelay > 0 || len(f.redis) > 0):
		return errors.New("--lock takes exclusive locks on lockd: it cannot be used with --shared, --limit, --once, --lock-delay or --backend")
	}
	if err := f.checkRedis(); err != nil {
		return err
	}
	if err := f.checkOnRevoke(); err != nil {
		return err
	}
	switch {
	case f.maxHold < 0:
		return fmt.Errorf("--max-hold %v must not be negative", f.maxHold)
	case f.conflictExitCode < 0 || f.conflictExitCode > 255:
		return fmt.Errorf("--conflict-exit-code %d: want 0 to 255", f.conflictExitCode)
	}
	f.killGrace, f.killGraceSet = defaultKillGrace(f.ttl), f.killGraceText != ""
	if f.killGraceSet {
		d, err := time.ParseDuration(f.killGraceText)
		if err != nil || d < 0 {
			return fmt.Errorf("--kill-grace %q: want a duration of 0 or more", f.killGraceText)
		}
		// The lease deadline is renewed every TTL/3 to about TTL·0.99 −
		// margin ahead: a longer grace would SIGTERM a healthy command.
		if d > f.ttl/2 {
			return fmt.Errorf("--kill-grace %v is more than half the TTL %v: the command would be stopped while the lease is healthy", d, f.ttl)
		}
		f.killGrace = d
	}
	return nil
}

func defaultKillGrace(ttl time.Duration) time.Duration { return min(2*time.Second, ttl/4) }

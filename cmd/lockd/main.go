// Command lockd is the lockd server and its command-line client.
//
//	lockd serve                        run a node (a durable one-node cluster by default)
//	lockd run NAME -- CMD [ARGS...]    run CMD while holding lock NAME
//	lockd cron 'SCHED' NAME -- CMD     run CMD once per period across a fleet
//	lockd ls [PREFIX]                  list locks
//	lockd describe NAME                show a lock's holders and queue
//	lockd check NAME TOKEN             exit 0 if TOKEN is a current grant of NAME, 1 if stale
//	lockd mark clear NAME              end a lock's completion mark early (admin)
//	lockd sessions                     list sessions
//	lockd release --force NAME         revoke a lock's holders (admin)
//	lockd request-release NAME         ask a lock's holders to let go
//	lockd policy NAME [--revoke-grace D]  show or set a lock's policy (admin)
//	lockd status                       show this node and the cluster
//	lockd top                          busiest locks, longest holds and queues, sessions near expiry
//	lockd members [--json]             list the cluster's members
//	lockd members remove ID            remove a member
//	lockd leader transfer [ID]         hand leadership to another voter
//	lockd snapshot save FILE           save a backup (restore: lockd serve --restore FILE)
//	lockd bench [--workload own|one|handoff|sessions]  load a cluster, report throughput and latency
//	lockd watch [PREFIX] [--from POS]  print lock events as they happen
//	lockd elect NAME VALUE -- CMD      run CMD only while leader of election NAME
//	lockd observe NAME                 print the leader of election NAME at each change
//	lockd cert ca|node|client [NAME]   make a dev CA and TLS certificates
//	lockd version                      print the version
//
// Exit statuses are stable and documented in docs/cli.md; see exitError.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/lockd-dev/lockd/internal/supervise"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise it comes from the module's build info.
var version = ""

func init() {
	if version != "" {
		return
	}
	version = "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
}

// Exit statuses other than a supervised command's own. 126 and 127 (the
// command could not be run / was not found) come from the supervisor, as
// its Result's status.
const (
	exitOK          = 0
	exitFailure     = 1  // anything else
	exitUsage       = 64 // bad flags or arguments, or a request the server refused as invalid
	exitUnavailable = 69 // no endpoint reachable, or no leader, until the wait ended
	exitStopped     = 71 // lockd stopped the command: lease lost or in jeopardy, or --max-hold ran out
	exitConflict    = 75 // lock not obtained (busy, or the wait ran out); --conflict-exit-code
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == supervise.Command {
		os.Exit(supervise.Main(os.Args[2:]))
	}
	m := &Main{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	err := m.Run(context.Background(), os.Args[1:])
	os.Exit(m.exitStatus(err))
}

// Main is the lockd command: it dispatches to a subcommand.
type Main struct {
	// Stdout receives the output of subcommands (tables, JSON).
	Stdout io.Writer
	// Stderr receives usage, help and the one-line error message.
	Stderr io.Writer
	// Getenv reads the environment (LOCKD_ENDPOINTS).
	Getenv func(string) string
}

// command is one lockd subcommand, made for one invocation.
type command interface {
	Run(ctx context.Context, args []string) error
}

// commandSpec is one row of the command table: every subcommand is made
// the same way, from the invoking environment.
type commandSpec struct {
	name    string
	summary string
	// ownSignals marks the commands that forward SIGINT and SIGTERM to
	// their command instead of being cancelled by them.
	ownSignals bool
	make       func(env commandEnv) command
}

// commands is every subcommand, in the order `lockd help` lists them.
var commands = []commandSpec{
	{"serve", "run a lockd node", false, func(e commandEnv) command { return &ServeCommand{Stderr: e.stderr} }},
	{"run", "run a command while holding a lock", true, func(e commandEnv) command { return &RunCommand{Stderr: e.stderr, Getenv: e.getenv} }},
	{"cron", "run a command once per period of a cron schedule across a fleet", true, func(e commandEnv) command { return &CronCommand{Stderr: e.stderr, Getenv: e.getenv} }},
	{"ls", "list locks", false, func(e commandEnv) command { return &LsCommand{env: e} }},
	{"describe", "show a lock's holders and queue", false, func(e commandEnv) command { return &DescribeCommand{env: e} }},
	{"explain", "show a lock's holders and queue, and what each holder itself waits for", false, func(e commandEnv) command { return &ExplainCommand{env: e} }},
	{"check", `"check NAME TOKEN": exit 0 if TOKEN is a current grant of NAME, 1 if stale`, false, func(e commandEnv) command { return &CheckCommand{env: e} }},
	{"mark", `"mark clear NAME" ends a lock's completion mark early (admin)`, false, func(e commandEnv) command { return &MarkCommand{env: e} }},
	{"sessions", "list sessions", false, func(e commandEnv) command { return &SessionsCommand{env: e} }},
	{"release", "revoke a lock's holders (admin; needs --force)", false, func(e commandEnv) command { return &ReleaseCommand{env: e} }},
	{"request-release", `ask a lock's holders to let go ("request-release NAME [--reason TEXT]"); an admin's starts the lock's revoke grace`, false, func(e commandEnv) command { return &RequestReleaseCommand{env: e} }},
	{"policy", `show or set a lock's policy ("policy NAME [--max-hold D] [--revoke-grace D] [--clear]"; setting is admin)`, false, func(e commandEnv) command { return &PolicyCommand{env: e} }},
	{"status", "show this node and the cluster", false, func(e commandEnv) command { return &StatusCommand{env: e} }},
	{"top", "the cluster at a glance, refreshed in place (q quits)", false, func(e commandEnv) command { return &TopCommand{env: e} }},
	{"members", `list the cluster's members; "members remove ID" removes one`, false, func(e commandEnv) command { return &MembersCommand{env: e} }},
	{"leader", `"leader transfer [ID]" hands leadership to another voter`, false, func(e commandEnv) command { return &LeaderCommand{env: e} }},
	{"snapshot", `"snapshot save FILE" writes a backup; "lockd serve --restore FILE" starts a new cluster from it`, false, func(e commandEnv) command { return &SnapshotCommand{env: e} }},
	{"bench", "load a cluster and report throughput, latency and errors", false, func(e commandEnv) command { return &BenchCommand{env: e} }},
	{"watch", `print lock events as they happen ("watch [PREFIX] [--json] [--from POS]")`, false, func(e commandEnv) command { return &WatchCommand{env: e} }},
	{"elect", `run a command only while leader of an election ("elect NAME VALUE -- CMD")`, true, func(e commandEnv) command {
		return &ElectCommand{run: RunCommand{Stderr: e.stderr, Getenv: e.getenv}}
	}},
	{"observe", `print the leader of an election at each change ("observe NAME")`, false, func(e commandEnv) command { return &ObserveCommand{env: e} }},
	{"cert", `make a dev CA and node/client TLS certificates ("cert ca", "cert node NAME", "cert client NAME")`, false, func(e commandEnv) command { return &CertCommand{env: e} }},
	{"token", "make a bearer token and print its auth-file lines (docs/security.md)", false, func(e commandEnv) command { return &TokenCommand{env: e} }},
	{"version", "print the version", false, func(e commandEnv) command { return &VersionCommand{Stdout: e.stdout, Stderr: e.stderr} }},
}

// Run runs the subcommand named by args[0] with the rest of args. Signals
// SIGINT and SIGTERM cancel ctx for every subcommand but run, elect and cron,
// which forward them to their command instead.
func (m *Main) Run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		m.usage()
		return usageError{errors.New("no command given")}
	}
	name, args := args[0], args[1:]
	switch name {
	case "help", "-h", "--help", "-help":
		m.usage()
		return nil
	}
	i := slices.IndexFunc(commands, func(c commandSpec) bool { return c.name == name })
	if i < 0 {
		// Said first and in one line: a typo should not scroll the
		// answer away under the whole usage text.
		return usageError{fmt.Errorf("unknown command %q%s; \"lockd help\" lists the commands", name, didYouMean(name))}
	}
	spec := commands[i]
	if !spec.ownSignals {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
		defer stop()
	}
	return spec.make(m.env()).Run(ctx, args)
}

// didYouMean suggests the command closest to a mistyped name (at most two
// edits away), as ", did you mean "ls"?"; "" when none is that close.
func didYouMean(name string) string {
	best, bestD := "", 3
	for _, c := range commands {
		if d := editDistance(name, c.name); d < bestD {
			best, bestD = c.name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func (m *Main) env() commandEnv {
	return commandEnv{stdout: m.Stdout, stderr: m.Stderr, getenv: m.Getenv}
}

func (m *Main) usage() {
	var b strings.Builder
	b.WriteString("lockd is a distributed lock service.\n\nUsage:\n\n\tlockd <command> [arguments]\n\nCommands:\n\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "\t%-10s %s\n", c.name, c.summary)
	}
	b.WriteString(`
Use "lockd <command> -h" for a command's flags. Client commands talk to
--endpoints, or $LOCKD_ENDPOINTS, or http://127.0.0.1:7070; --ca, --cert
and --key ($LOCKD_CA, $LOCKD_CERT, $LOCKD_KEY) turn on TLS; the token is
in --token-file or $LOCKD_TOKEN_FILE when the server runs with --auth-file.
`)
	fmt.Fprint(m.Stderr, b.String())
}

// exitStatus prints err, if it is to be printed, and returns the process's
// exit status.
func (m *Main) exitStatus(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	var ue usageError
	switch {
	case errors.As(err, &ee):
		if ee.err != nil {
			fmt.Fprintf(m.Stderr, "lockd: %s%s\n", oneLine(ee.err), refusedHint(ee.err))
		}
		return ee.code
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(m.Stderr, "lockd: %s\n", oneLine(ue.err))
		return exitUsage
	}
	fmt.Fprintf(m.Stderr, "lockd: %s%s\n", oneLine(err), refusedHint(err))
	return exitFailure
}

// refusedHint suggests the likely cause when err comes from connections
// refused by every endpoint: no server runs there. It names the addresses
// that refused; "" for any other error.
func refusedHint(err error) string {
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return ""
	}
	var addrs []string
	var walk func(error)
	walk = func(e error) {
		var op *net.OpError
		if ok := errors.As(e, &op); ok && op.Addr != nil && errors.Is(op.Err, syscall.ECONNREFUSED) && !slices.Contains(addrs, op.Addr.String()) {
			addrs = append(addrs, op.Addr.String())
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	walk(err)
	if len(addrs) == 0 {
		return " (is `lockd serve` running there?)"
	}
	return " (is `lockd serve` running at " + strings.Join(addrs, ", ") + "?)"
}

// oneLine keeps messages to one line, as scripts and people expect. The
// lines of a multi-line error (errors.Join) are kept apart by "; ". The
// client library's errors start with "lockd: " too; the caller prints that
// prefix once, so oneLine drops it from every part of the message.
func oneLine(err error) string {
	var parts []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			parts = append(parts, dropPrefix(line))
		}
	}
	return printable(strings.Join(parts, "; "))
}

// dropPrefix removes "lockd: " where it starts a part of a wrapped message:
// at the start, or after ": " or "; ". Elsewhere (inside a quoted lock
// name, say) it stays.
func dropPrefix(msg string) string {
	const prefix = "lockd: "
	var b strings.Builder
	for i := 0; i < len(msg); {
		atPart := i == 0 || strings.HasSuffix(msg[:i], ": ") || strings.HasSuffix(msg[:i], "; ")
		if atPart && strings.HasPrefix(msg[i:], prefix) {
			i += len(prefix)
			continue
		}
		b.WriteByte(msg[i])
		i++
	}
	return b.String()
}

// usageError is a bad flag or argument: exit status 64.
type usageError struct{ err error }

// Error returns the message of the bad flag or argument.
func (e usageError) Error() string { return e.err.Error() }

// Unwrap returns the underlying error.
func (e usageError) Unwrap() error { return e.err }

// exitError ends lockd with a given status. err is printed on stderr; a nil
// err exits silently (a supervised command's own status).
type exitError struct {
	code int
	err  error
}

// Error returns the message to print, or the status when there is none.
func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

// Unwrap returns the error to print, nil for a silent exit.
func (e *exitError) Unwrap() error { return e.err }

func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

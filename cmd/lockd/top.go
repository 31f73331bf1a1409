package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/term"

	"github.com/lockd-dev/lockd"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// TopCommand is `lockd top`: the cluster at a glance in a terminal (the
// leader, the busiest locks, the longest holds and queues, the sessions
// nearest expiry), refreshed in place until q or Ctrl-C. When stdout is not
// a terminal it prints one snapshot and exits, for scripts and logs.
type TopCommand struct {
	env commandEnv
	// stdin is read for q and Ctrl-C (os.Stdin when nil).
	stdin *os.File
}

// topFlags are top's own flags.
type topFlags struct {
	interval time.Duration
	prefix   string
	rows     int
	once     bool
	maxLocks int
}

// Run shows the screen until q, Ctrl-C or ctx ends.
func (c *TopCommand) Run(ctx context.Context, args []string) error {
	var tf topFlags
	_, cf, err := c.env.parse("top", "lockd top [--interval 1s] [--prefix P] [-n 10] [--once]", args, 0, 0, func(fs *flag.FlagSet) {
		fs.DurationVar(&tf.interval, "interval", time.Second, "time between refreshes")
		fs.StringVar(&tf.prefix, "prefix", "", "only locks whose name starts with this")
		fs.IntVar(&tf.rows, "n", 8, "rows in each table")
		fs.BoolVar(&tf.once, "once", false, "print one snapshot and exit, even on a terminal")
		fs.IntVar(&tf.maxLocks, "max-locks", 20000, "read at most this many locks per refresh")
	})
	if err != nil {
		return err
	}
	if tf.interval <= 0 || tf.rows <= 0 || tf.maxLocks <= 0 {
		return usageError{fmt.Errorf("--interval, -n and --max-locks must be positive")}
	}
	cl, err := cf.client()
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	out, isFile := c.env.stdout.(*os.File)
	tty := isFile && term.IsTerminal(int(out.Fd())) && !tf.once
	t := &topState{flags: tf, changes: map[string]int{}, tokens: map[string]uint64{}}
	if !tty {
		snap, err := t.read(ctx, cf, cl)
		if err != nil {
			return err
		}
		_, err = io.WriteString(c.env.stdout, t.render(snap, time.Now(), 0, 0, "\n"))
		return err
	}
	return t.loop(ctx, cf, cl, out, c.stdin)
}

// loop refreshes the screen in place on the alternate screen until q,
// Ctrl-C (read from stdin in raw mode) or ctx ends.
func (t *topState) loop(ctx context.Context, cf *clientFlags, cl *lockd.Client, out, in *os.File) error {
	if in == nil {
		in = os.Stdin
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if term.IsTerminal(int(in.Fd())) {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return fmt.Errorf("terminal raw mode: %w", err)
		}
		defer term.Restore(int(in.Fd()), old)
	}
	// The reader may stay blocked in Read after we return; the process
	// exits right after.
	go func() {
		b := make([]byte, 16)
		for {
			n, err := in.Read(b)
			if err != nil {
				return
			}
			for _, k := range b[:n] {
				if k == 'q' || k == 'Q' || k == 3 || k == 4 { // q, Ctrl-C, Ctrl-D
					cancel()
					return
				}
			}
		}
	}()
	fmt.Fprint(out, "\x1b[?1049h\x1b[?25l") // alternate screen, hide the cursor
	defer fmt.Fprint(out, "\x1b[?25h\x1b[?1049l")
	tick := time.NewTicker(t.flags.interval)
	defer tick.Stop()
	for {
		w, h, err := term.GetSize(int(out.Fd()))
		if err != nil {
			w, h = 100, 40
		}
		var screen string
		snap, err := t.read(ctx, cf, cl)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			screen = fmt.Sprintf("lockd top: %s\r\n(retrying every %v; q quits)", oneLine(err), t.flags.interval)
		default:
			screen = t.render(snap, time.Now(), w, h, "\r\n")
		}
		// Home, each line cleared to its end, then the rest of the screen.
		fmt.Fprint(out, "\x1b[H"+strings.ReplaceAll(screen, "\r\n", "\x1b[K\r\n")+"\x1b[J")
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// topState is what top remembers between refreshes: how often each lock
// changed hands (a new token).
type topState struct {
	flags   topFlags
	tokens  map[string]uint64 // lock -> newest token seen
	changes map[string]int    // lock -> grants seen since top started
	reads   int
}

// topSnapshot is one refresh's data.
type topSnapshot struct {
	status    *lockdv1.StatusResponse
	locks     []*lockdv1.LockInfo
	truncated bool
	sessions  []*lockdv1.SessionInfo
}

// read fetches status, locks and sessions; each call is bounded by
// --timeout.
func (t *topState) read(ctx context.Context, cf *clientFlags, cl *lockd.Client) (*topSnapshot, error) {
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()
	svc := cl.Service()
	st, err := svc.Status(ctx, connect.NewRequest(&lockdv1.StatusRequest{}))
	if err != nil {
		return nil, callError("status", err)
	}
	snap := &topSnapshot{status: st.Msg}
	req := &lockdv1.ListLocksRequest{Prefix: t.flags.prefix, PageSize: 1000}
	for {
		resp, err := svc.ListLocks(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, callError("list locks", err)
		}
		snap.locks = append(snap.locks, resp.Msg.GetLocks()...)
		if resp.Msg.GetNextPageToken() == "" {
			break
		}
		if len(snap.locks) >= t.flags.maxLocks {
			snap.truncated = true
			break
		}
		req.PageToken = resp.Msg.GetNextPageToken()
	}
	ss, err := svc.ListSessions(ctx, connect.NewRequest(&lockdv1.ListSessionsRequest{}))
	if err != nil {
		return nil, callError("list sessions", err)
	}
	snap.sessions = ss.Msg.GetSessions()
	t.reads++
	seen := make(map[string]bool, len(snap.locks))
	for _, l := range snap.locks {
		seen[l.GetName()] = true
		for _, h := range l.GetHolders() {
			if h.GetToken() > t.tokens[l.GetName()] {
				t.tokens[l.GetName()] = h.GetToken()
				t.changes[l.GetName()]++
			}
		}
	}
	if !snap.truncated {
		// Forget locks that are gone (cron's NAME@START names are new every
		// period): top's memory follows the table, not its history.
		for name := range t.tokens {
			if !seen[name] {
				delete(t.tokens, name)
				delete(t.changes, name)
			}
		}
	}
	return snap, nil
}

// render lays the snapshot out in lines of at most width columns (0: no
// limit) and at most height lines (0: no limit), joined by nl.
func (t *topState) render(s *topSnapshot, now time.Time, width, height int, nl string) string {
	var lines []string
	add := func(format string, a ...any) { lines = append(lines, fmt.Sprintf(format, a...)) }
	st := s.status
	leader := st.GetLeader()
	if leader == "" {
		leader = "NONE"
	}
	leader = printable(leader)
	more := ""
	if s.truncated {
		more = fmt.Sprintf(" (first %d read)", len(s.locks))
	}
	add("lockd top  %s  leader %s  term %d  %d locks%s  %d sessions  commit %d", now.Format("15:04:05"), leader, st.GetTerm(), st.GetLocks(), more, st.GetSessions(), st.GetCommitIndex())
	var members []string
	for _, m := range st.GetMembers() {
		members = append(members, printable(m.GetId()+":"+m.GetRole()))
	}
	add("members    %s", strings.Join(members, "  "))
	n := t.flags.rows

	// Busiest: the locks that changed hands most often while top ran, then
	// the most contended (holders + waiters) now.
	busy := slices.Clone(s.locks)
	slices.SortStableFunc(busy, func(a, b *lockdv1.LockInfo) int {
		if d := t.changes[b.GetName()] - t.changes[a.GetName()]; d != 0 {
			return d
		}
		return (len(b.GetHolders()) + len(b.GetWaiters())) - (len(a.GetHolders()) + len(a.GetWaiters()))
	})
	add("")
	add("%-42s %11s  %7s  %7s", "BUSIEST LOCKS", "GRANTS SEEN", "HOLDERS", "WAITERS")
	for _, l := range busy[:min(n, len(busy))] {
		add("  %-40s %11d  %7d  %7d", clip(printable(l.GetName()), 40), max(0, t.changes[l.GetName()]-1), len(l.GetHolders()), len(l.GetWaiters()))
	}

	type hold struct {
		lock string
		h    *lockdv1.Holder
	}
	var holds []hold
	for _, l := range s.locks {
		for _, h := range l.GetHolders() {
			holds = append(holds, hold{l.GetName(), h})
		}
	}
	slices.SortFunc(holds, func(a, b hold) int { return a.h.GetGrantedAt().AsTime().Compare(b.h.GetGrantedAt().AsTime()) })
	expires := map[string]time.Time{}
	for _, se := range s.sessions {
		if se.GetExpiresAt() != nil {
			expires[se.GetSessionId()] = se.GetExpiresAt().AsTime()
		}
	}
	add("")
	add("%-42s %-24s %17s %9s %8s", "LONGEST HOLDS", "HOLDER", "TOKEN", "HELD", "LEASE")
	for _, h := range holds[:min(n, len(holds))] {
		lease := "-"
		if e, ok := expires[h.h.GetSessionId()]; ok {
			lease = dur(e.Sub(now))
		}
		add("  %-40s %-24s %17d %9s %8s", clip(printable(h.lock), 40), clip(printable(ownerOr(h.h.GetOwner(), h.h.GetSessionId())), 24), h.h.GetToken(), dur(now.Sub(h.h.GetGrantedAt().AsTime())), lease)
	}

	queued := slices.Clone(s.locks)
	queued = slices.DeleteFunc(queued, func(l *lockdv1.LockInfo) bool { return len(l.GetWaiters()) == 0 })
	slices.SortStableFunc(queued, func(a, b *lockdv1.LockInfo) int { return len(b.GetWaiters()) - len(a.GetWaiters()) })
	add("")
	add("%-42s %7s  %-24s %8s", "LONGEST QUEUES", "WAITERS", "FIRST WAITER", "WAITING")
	for _, l := range queued[:min(n, len(queued))] {
		w := l.GetWaiters()[0]
		add("  %-40s %7d  %-24s %8s", clip(printable(l.GetName()), 40), len(l.GetWaiters()), clip(printable(ownerOr(w.GetOwner(), w.GetSessionId())), 24), dur(now.Sub(w.GetQueuedAt().AsTime())))
	}

	near := slices.Clone(s.sessions)
	near = slices.DeleteFunc(near, func(se *lockdv1.SessionInfo) bool { return se.GetExpiresAt() == nil })
	slices.SortFunc(near, func(a, b *lockdv1.SessionInfo) int {
		return a.GetExpiresAt().AsTime().Compare(b.GetExpiresAt().AsTime())
	})
	add("")
	add("%-42s %10s %8s %6s %6s", "SESSIONS NEAR EXPIRY", "EXPIRES IN", "TTL", "HOLDS", "WAITS")
	for _, se := range near[:min(n, len(near))] {
		add("  %-40s %10s %8s %6d %6d", clip(printable(ownerOr(se.GetOwner(), se.GetSessionId())), 40), dur(se.GetExpiresAt().AsTime().Sub(now)), dur(se.GetTtl().AsDuration()), se.GetHolds(), se.GetWaits())
	}
	if nl == "\r\n" {
		add("")
		add("q quits; refresh every %v", t.flags.interval)
	}
	if height > 0 && len(lines) > height {
		lines = lines[:height]
	}
	if width > 0 {
		for i, l := range lines {
			lines[i] = clip(l, width)
		}
	}
	return strings.Join(lines, nl) + nl
}

// clip cuts s to n runes, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n <= 1 {
		return string(r[:n])
	}
	return string(r[:n-1]) + "…"
}

func ownerOr(owner, id string) string {
	if owner != "" {
		return owner
	}
	return id
}

// dur prints a duration the way a person reads a countdown.
func dur(d time.Duration) string {
	switch {
	case d < 0:
		return "expiring"
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

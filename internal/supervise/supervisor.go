package supervise

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// killLead is how long before the deadline SIGKILL is sent, so the kernel
// has taken the processes down, and lockd run has exited, by the deadline
// itself. At most a quarter of the kill-grace.
const killLead = 100 * time.Millisecond

// orphanPoll is how often a group that still has members but no process
// the supervisor can wait for is checked (members that are not descendants,
// which only another process of the session can put there).
const orphanPoll = 10 * time.Millisecond

// Main is the supervisor process: the lockd binary's hidden [Command]
// subcommand. args are the flags --deadline NS, --kill-grace D and
// --max-hold D, then "--" and the command. It expects the control pipe on
// fd 3 and the report pipe on fd 4 (see [Start]) and returns the exit status
// for the supervisor process: the command's status, as [Result.Status].
func Main(args []string) int {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	deadline := fs.Int64("deadline", 0, "lease deadline, CLOCK_MONOTONIC nanoseconds")
	killGrace := fs.Duration("kill-grace", 2*time.Second, "time between SIGTERM and SIGKILL")
	maxHold := fs.Duration("max-hold", 0, "end the command after this long (0: never)")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(os.Stderr, "lockd %s: %v\n", Command, err)
		return 64
	}
	argv := fs.Args()
	if len(argv) == 0 || *deadline <= 0 || *killGrace < 0 || *maxHold < 0 {
		fmt.Fprintf(os.Stderr, "lockd %s: usage: --deadline NS [--kill-grace D] [--max-hold D] -- CMD [ARGS...]\n", Command)
		return 64
	}
	// Keep our pipes out of the command: if a grandchild held the report
	// pipe open, lockd run could not tell that we died.
	syscall.CloseOnExec(controlFD)
	syscall.CloseOnExec(reportFD)
	ctrl := os.NewFile(controlFD, "control")
	out := os.NewFile(reportFD, "report")
	if ctrl == nil || out == nil {
		fmt.Fprintf(os.Stderr, "lockd %s: control and report pipes (fd 3, 4) missing\n", Command)
		return 64
	}

	// Handled, not ignored: an ignored disposition would be inherited by the
	// command across exec.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for range sigs {
		}
	}()

	if err := setSubreaper(); err != nil {
		fmt.Fprintf(os.Stderr, "lockd %s: %v\n", Command, err)
		return 70
	}

	s := &supervisor{
		deadline:  *deadline,
		killGrace: int64(*killGrace),
		killLead:  int64(min(killLead, *killGrace/4)),
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Pdeathsig: if the supervisor itself is killed, the kernel kills the
	// command too. It fires when the forking thread exits, so this goroutine
	// keeps its thread for the supervisor's whole life.
	runtime.LockOSThread()
	cmd.SysProcAttr = commandAttr()
	if Mono() >= s.deadline-s.killGrace {
		// The lease is (nearly) gone already: never start the command.
		r := Result{Killed: ReasonDeadline, ExitCode: 128 + int(syscall.SIGKILL)}
		_, _ = out.Write(encodeReport(report{Event: eventExited, Result: r}))
		return r.Status()
	}
	if err := cmd.Start(); err != nil {
		r := Result{ExitCode: execStatus(err), ExecError: fmt.Sprintf("cannot run %s: %v", argv[0], errors.Unwrap(err))}
		if errors.Unwrap(err) == nil {
			r.ExecError = err.Error()
		}
		_, _ = out.Write(encodeReport(report{Event: eventExited, Result: r}))
		return r.ExitCode
	}
	s.pid = cmd.Process.Pid
	if *maxHold > 0 {
		s.maxHoldAt = Mono() + int64(*maxHold)
	}
	_, _ = out.Write(encodeReport(report{Event: eventStarted, Result: Result{Pid: s.pid}}))

	msgs := make(chan message, 16)
	go readControl(ctrl, msgs)
	reaped := make(chan reapEvent, 16)
	go reap(reaped)

	r := s.run(msgs, reaped)
	_, _ = out.Write(encodeReport(report{Event: eventExited, Result: r}))
	return r.Status()
}

// execStatus maps an error starting a command to the shells' statuses: 127
// when it was not found, 126 when it was found but could not run.
func execStatus(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return 127
	}
	return 126
}

func readControl(r io.Reader, msgs chan<- message) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m, err := parseMessage(sc.Text())
		if err != nil {
			fmt.Fprintf(os.Stderr, "lockd %s: %v\n", Command, err)
			continue
		}
		msgs <- m
	}
	// EOF or a read error: either way nobody is renewing the lease.
	msgs <- message{kind: msgEOF}
}

type reapEvent struct {
	pid    int // -1: no children left (ECHILD)
	status unix.WaitStatus
}

// reap waits for every child, the command and orphans reparented to us, until
// there are none. Once there are none there can be no more: every descendant
// is either a child or below one, and we never start another.
func reap(events chan<- reapEvent) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			events <- reapEvent{pid: -1}
			return
		}
		events <- reapEvent{pid: pid, status: ws}
	}
}

// supervisor is the state of Main's loop. All times are CLOCK_MONOTONIC
// nanoseconds; 0 means "not set".
type supervisor struct {
	pid       int
	killGrace int64
	killLead  int64

	deadline   int64 // current lease deadline
	maxHoldAt  int64
	lostAt     int64 // control pipe EOF
	exitedAt   int64 // the command itself exited
	stopAt     int64 // stop message
	stopReason Reason

	termSent int64
	killSent int64
	reason   Reason

	status     unix.WaitStatus
	exited     bool
	noChildren bool
}

// trigger is a point in time at which a signal is due, and why.
type trigger struct {
	at     int64
	reason Reason
}

func earliest(ts ...trigger) trigger {
	best := trigger{at: math.MaxInt64}
	for _, t := range ts {
		if t.at != 0 && t.at < best.at {
			best = t
		}
	}
	return best
}

// plan returns when SIGTERM and SIGKILL are due, given everything known now.
func (s *supervisor) plan() (term, kill trigger) {
	plus := func(at, d int64) int64 {
		if at == 0 {
			return 0
		}
		return at + d
	}
	term = earliest(
		trigger{max(s.deadline-s.killGrace, 1), ReasonDeadline},
		trigger{s.maxHoldAt, ReasonMaxHold},
		trigger{s.lostAt, ReasonParentGone},
		trigger{s.exitedAt, ReasonNone},
		trigger{s.stopAt, s.stopReason},
	)
	kill = earliest(
		trigger{max(s.deadline-s.killLead, 1), ReasonDeadline},
		trigger{plus(s.maxHoldAt, s.killGrace), ReasonMaxHold},
		trigger{plus(s.lostAt, s.killGrace), ReasonParentGone},
		trigger{plus(s.exitedAt, s.killGrace), ReasonNone},
		trigger{s.stopAt, s.stopReason},
		trigger{plus(s.termSent, s.killGrace), s.reason},
	)
	return term, kill
}

// signalAll sends sig to the command's group and to every descendant of the
// supervisor, so a process that moved to another group or session is not
// left behind.
func (s *supervisor) signalAll(sig syscall.Signal) {
	_ = unix.Kill(-s.pid, sig)
	for _, pid := range descendants(os.Getpid()) {
		_ = unix.Kill(pid, sig)
	}
}

func (s *supervisor) act(now int64) {
	term, kill := s.plan()
	if s.killSent == 0 && now >= kill.at {
		if s.termSent == 0 {
			s.reason = kill.reason
		}
		s.killSent = now
		s.signalAll(syscall.SIGKILL)
		return
	}
	if s.termSent == 0 && s.killSent == 0 && now >= term.at {
		s.reason = term.reason
		s.termSent = now
		s.signalAll(syscall.SIGTERM)
		// A stopped process only acts on SIGTERM once continued.
		s.signalAll(syscall.SIGCONT)
	}
}

func groupGone(pgid int) bool {
	return unix.Kill(-pgid, 0) == unix.ESRCH
}

func (s *supervisor) run(msgs <-chan message, reaped <-chan reapEvent) Result {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var poll <-chan time.Time
	for {
		now := Mono()
		if s.exited && s.noChildren && groupGone(s.pid) {
			break
		}
		s.act(now)
		if s.killSent != 0 && s.noChildren && poll == nil {
			// Members we cannot wait for: keep killing until they are gone.
			t := time.NewTicker(orphanPoll)
			defer t.Stop()
			poll = t.C
		}
		next := int64(math.MaxInt64)
		term, kill := s.plan()
		if s.termSent == 0 {
			next = min(next, term.at)
		}
		if s.killSent == 0 {
			next = min(next, kill.at)
		}
		var wake <-chan time.Time
		if next != math.MaxInt64 {
			timer.Reset(time.Duration(max(next-Mono(), 0)))
			wake = timer.C
		}
		select {
		case m := <-msgs:
			s.handle(m)
		case ev := <-reaped:
			if ev.pid == -1 {
				s.noChildren = true
				if !s.exited {
					// Cannot happen: the command is our child.
					s.exited, s.exitedAt = true, Mono()
				}
				continue
			}
			if ev.pid == s.pid {
				s.exited, s.exitedAt, s.status = true, Mono(), ev.status
			}
			if s.killSent != 0 {
				// A process that forked after our last sweep may have just
				// been orphaned to us: sweep again.
				s.signalAll(syscall.SIGKILL)
			}
		case <-wake:
		case <-poll:
			s.signalAll(syscall.SIGKILL)
		}
	}
	r := Result{Pid: s.pid, Killed: s.reason, TermAt: s.termSent, KillAt: s.killSent}
	switch {
	case s.status.Signaled():
		r.Signal = s.status.Signal()
	default:
		r.ExitCode = s.status.ExitStatus()
	}
	return r
}

func (s *supervisor) handle(m message) {
	switch m.kind {
	case msgDeadline:
		s.deadline = m.deadline
	case msgSignal:
		_ = unix.Kill(-s.pid, m.signal)
	case msgStop:
		if s.stopAt == 0 {
			s.stopAt = Mono()
			s.stopReason = Reason(m.reason)
			if s.stopReason == ReasonNone {
				s.stopReason = "stopped"
			}
		}
	case msgEOF:
		if s.lostAt == 0 {
			s.lostAt = Mono()
		}
	}
}

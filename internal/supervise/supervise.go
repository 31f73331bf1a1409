// Package supervise runs a command under a small supervisor process so that the
// command's whole process group never outlives a lock's lease.
//
// `lockd run` starts the supervisor by re-executing its own binary with the
// hidden subcommand [Command]. The supervisor:
//
//   - makes itself a child subreaper, so orphaned grandchildren are reparented
//     to it and reaped by it;
//   - starts the user's command in a new process group (its pid is the group
//     id) with the environment it was itself given;
//   - reads messages from `lockd run` on a pipe: deadline updates (absolute
//     CLOCK_MONOTONIC nanoseconds, the same clock in both processes), signals
//     to forward to the group, and "stop now";
//   - sends SIGTERM to the group (and to every descendant that left it) at
//     deadline − kill-grace, and SIGKILL no later than the deadline. When
//     max-hold is set: SIGTERM at start + max-hold, SIGKILL kill-grace later.
//     When the pipe reaches EOF (`lockd run` died): SIGTERM at once, SIGKILL at
//     min(now + kill-grace, deadline). After any SIGTERM, SIGKILL follows at
//     most kill-grace later. A stop message sends SIGKILL at once;
//   - when the command exits by itself, ends what it left behind in its group
//     the same way (SIGTERM, SIGKILL kill-grace later);
//   - exits only when the group is empty and it has no children left, after
//     writing the outcome ([Result]) on a second pipe.
//
// A `lockd run` that is killed or frozen (SIGSTOP) stops renewing the
// deadline or closes the pipe, so the supervisor ends the group in time on
// its own. The lock is released by `lockd run` only after [Process.Wait]
// returns, that is after the group is empty.
//
// The supervisor ignores SIGINT, SIGTERM and SIGHUP sent to it (it shares
// `lockd run`'s process group, which forwards those signals itself); it ends
// the group when `lockd run` goes away.
package supervise

import (
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Command is the hidden subcommand of the lockd binary that runs [Main].
const Command = "__supervise"

// Reason says why the supervisor ended the command's process group.
type Reason string

// Reasons the supervisor ends a group by itself. A stop message carries its
// own reason text.
const (
	// ReasonNone: the supervisor did not end the command; it ended by itself
	// or by a forwarded signal.
	ReasonNone Reason = ""
	// ReasonDeadline: the lease deadline came close (SIGTERM at
	// deadline − kill-grace, SIGKILL by the deadline).
	ReasonDeadline Reason = "lease deadline"
	// ReasonMaxHold: the --max-hold time ran out.
	ReasonMaxHold Reason = "max-hold"
	// ReasonParentGone: the process driving the supervisor (lockd run) went
	// away, so nobody renews the lease.
	ReasonParentGone Reason = "lockd run went away"
)

// Result is the outcome of a supervised command.
type Result struct {
	// Pid is the command's pid, also its process group id; 0 when the
	// command could not be started.
	Pid int `json:"pid,omitempty"`
	// ExitCode is the command's exit status when it exited (Signal is 0), or
	// 126/127 when it could not be run (ExecError is set).
	ExitCode int `json:"exit_code"`
	// Signal is the signal that ended the command, 0 when it exited.
	Signal syscall.Signal `json:"signal,omitempty"`
	// Killed is why the supervisor ended the group; ReasonNone when it did not.
	Killed Reason `json:"killed,omitempty"`
	// ExecError says why the command could not be run.
	ExecError string `json:"exec_error,omitempty"`
	// TermAt is when the supervisor first sent SIGTERM to the group
	// (CLOCK_MONOTONIC nanoseconds), 0 when it did not.
	TermAt int64 `json:"term_at,omitempty"`
	// KillAt is when the supervisor first sent SIGKILL to the group
	// (CLOCK_MONOTONIC nanoseconds), 0 when it did not.
	KillAt int64 `json:"kill_at,omitempty"`
}

// Status is the command's status the way shells report it: the exit code,
// or 128+n when killed by signal n.
func (r Result) Status() int {
	if r.Signal != 0 {
		return 128 + int(r.Signal)
	}
	return r.ExitCode
}

// String describes the outcome for people.
func (r Result) String() string {
	switch {
	case r.ExecError != "":
		return r.ExecError
	case r.Killed != ReasonNone && r.Signal != 0:
		return fmt.Sprintf("stopped by lockd (%s): killed by %s", r.Killed, unix.SignalName(r.Signal))
	case r.Killed != ReasonNone:
		return fmt.Sprintf("stopped by lockd (%s): exit status %d", r.Killed, r.ExitCode)
	case r.Signal != 0:
		return fmt.Sprintf("killed by %s", unix.SignalName(r.Signal))
	default:
		return fmt.Sprintf("exit status %d", r.ExitCode)
	}
}

// Mono returns the current CLOCK_MONOTONIC time in nanoseconds, the clock
// deadlines travel in between lockd run and the supervisor.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("supervise: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// MonoOf converts t to CLOCK_MONOTONIC nanoseconds. It uses t's monotonic
// reading when t has one, so wall clock jumps do not move it.
func MonoOf(t time.Time) int64 {
	return Mono() + int64(time.Until(t))
}

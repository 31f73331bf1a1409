package supervise

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config describes a command to run under a supervisor.
type Config struct {
	// Command is the program and its arguments. Required.
	Command []string
	// Env is the command's environment; nil means this process's.
	Env []string
	// Stdin, Stdout and Stderr are passed to the command as they are; nil
	// means /dev/null.
	Stdin, Stdout, Stderr *os.File
	// Deadline is the lease deadline the group must not outlive; renew it
	// with [Process.SetDeadline]. Required.
	Deadline time.Time
	// KillGrace is the time between SIGTERM and SIGKILL, and how long before
	// the deadline SIGTERM is sent.
	KillGrace time.Duration
	// MaxHold ends the command after this long (SIGTERM, then SIGKILL
	// KillGrace later); 0 means never.
	MaxHold time.Duration
	// Self is the argv that starts a supervisor: it must run [Main] with the
	// arguments that follow. Default: this executable and [Command].
	Self []string
}

// Process is a supervised command, seen from the process that started it.
// Its methods may be called concurrently.
type Process struct {
	cmd    *exec.Cmd
	pid    int
	report *bufio.Reader
	done   chan struct{}
	result Result
	ended  bool // the first report was the last: the command never ran
	err    error

	mu   sync.Mutex // serialises writes on ctrl
	ctrl *os.File
}

// Start starts a supervisor, which starts the command in a new process group.
// It returns once the command runs. When the command cannot be run, Start
// returns a Process whose Wait reports it (exit status 126 or 127), and no
// error: only a supervisor that cannot start is an error.
func Start(cfg Config) (*Process, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("supervise: no command")
	}
	if cfg.Deadline.IsZero() {
		return nil, errors.New("supervise: no deadline")
	}
	self := cfg.Self
	if len(self) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("supervise: find own executable: %w", err)
		}
		self = []string{exe, Command}
	}
	ctrlR, ctrlW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("supervise: %w", err)
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		ctrlR.Close()
		ctrlW.Close()
		return nil, fmt.Errorf("supervise: %w", err)
	}
	// Become a subreaper too: if the supervisor is killed, the command's
	// descendants that left its group come to us instead of init, so
	// supervisorDied can still find and end them before the lock is
	// released. Best effort (Linux only).
	_ = setSubreaper()
	args := append(self[1:len(self):len(self)],
		fmt.Sprintf("--deadline=%d", MonoOf(cfg.Deadline)),
		fmt.Sprintf("--kill-grace=%s", cfg.KillGrace),
		fmt.Sprintf("--max-hold=%s", cfg.MaxHold),
		"--")
	args = append(args, cfg.Command...)
	cmd := exec.Command(self[0], args...)
	cmd.Env = cfg.Env
	// Only *os.File values, so os/exec starts no copying goroutines.
	if cfg.Stdin != nil {
		cmd.Stdin = cfg.Stdin
	}
	if cfg.Stdout != nil {
		cmd.Stdout = cfg.Stdout
	}
	if cfg.Stderr != nil {
		cmd.Stderr = cfg.Stderr
	}
	cmd.ExtraFiles = []*os.File{ctrlR, repW} // fd 3 and 4 in the supervisor
	// Its own process group: a signal to the caller's group (Ctrl-Z,
	// kill -STOP or kill -9 of the job) must not stop or kill the supervisor
	// together with the caller, or nothing would end the command at the
	// deadline. The caller forwards INT/TERM/HUP itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	ctrlR.Close()
	repW.Close()
	if err != nil {
		ctrlW.Close()
		repR.Close()
		return nil, fmt.Errorf("supervise: start supervisor: %w", err)
	}
	p := &Process{cmd: cmd, ctrl: ctrlW, report: bufio.NewReader(repR), done: make(chan struct{})}
	supervisors.Store(cmd.Process.Pid, true)
	first, err := p.readReport()
	switch {
	case err != nil:
		// The supervisor died before starting the command: nothing runs.
		ctrlW.Close()
		repR.Close()
		werr := cmd.Wait()
		supervisors.Delete(cmd.Process.Pid)
		return nil, fmt.Errorf("supervise: supervisor failed (%v): %w", werr, err)
	case first.Event == eventExited:
		// The command could not run, or its lease was gone before it could.
		p.result, p.ended = first.Result, true
		go p.wait(repR)
	default:
		p.pid = first.Pid
		go p.wait(repR)
	}
	return p, nil
}

func (p *Process) readReport() (report, error) {
	line, err := p.report.ReadBytes('\n')
	if err != nil {
		return report{}, fmt.Errorf("read report: %w", err)
	}
	var r report
	if err := json.Unmarshal(line, &r); err != nil {
		return report{}, fmt.Errorf("read report: %w", err)
	}
	return r, nil
}

func (p *Process) wait(repR *os.File) {
	if !p.ended {
		r, err := p.readReport()
		if err == nil && r.Event == eventExited {
			p.result = r.Result
		} else {
			p.err = p.supervisorDied(err)
		}
	}
	repR.Close()
	p.Abandon()
	// The group is gone: the caller need not wait for the supervisor to exit.
	close(p.done)
	_ = p.cmd.Wait()
	supervisors.Delete(p.cmd.Process.Pid)
}

// supervisors holds the pids of the supervisors this process started and
// has not reaped yet: our direct children that are not orphans.
var supervisors sync.Map

func isSupervisor(pid int) bool {
	_, ok := supervisors.Load(pid)
	return ok
}

// supervisorDied ends the group itself when the supervisor died without a
// report (someone killed it), so the caller can still rely on "the group is
// gone when Wait returns". Descendants that left the group cannot be found
// without the supervisor, except those orphaned to us (see Start).
//
// As the supervisor's subreaper, this process inherits the command and its
// orphans, dead or alive: it must reap them itself. A zombie stays a member
// of its process group, so without the reaping the group would never be
// gone and Wait would block forever, keeping the lease (and the lock) alive.
func (p *Process) supervisorDied(cause error) error {
	if p.pid <= 0 {
		return fmt.Errorf("supervise: supervisor died: %w", cause)
	}
	t := time.NewTicker(orphanPoll)
	defer t.Stop()
	for {
		_ = unix.Kill(-p.pid, syscall.SIGKILL)
		orphans := reapOrphans()
		if orphans == 0 && groupGone(p.pid) {
			break
		}
		<-t.C
	}
	return fmt.Errorf("supervise: supervisor died, its processes killed: %w", cause)
}

// reapOrphans kills the processes reparented to this process (its direct
// children that are not supervisors it started) and all below them, reaps
// those that have died, and returns how many it found.
func reapOrphans() int {
	self := os.Getpid()
	var orphans []int
	for _, pid := range descendants(self) {
		if ppid, ok := parentOf(pid); ok && ppid == self && !isSupervisor(pid) {
			orphans = append(orphans, pid)
		}
	}
	for _, pid := range orphans {
		for _, d := range descendants(pid) {
			_ = unix.Kill(d, syscall.SIGKILL)
		}
		_ = unix.Kill(pid, syscall.SIGKILL)
		// Only these pids, never -1: the supervisors are reaped by their
		// own exec.Cmd.
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
	return len(orphans)
}

// Pid returns the command's pid, which is also its process group id; 0 when
// the command could not be run.
func (p *Process) Pid() int { return p.pid }

// Done is closed when the group is gone and Wait returns at once.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits until the command's process group is gone and returns the
// outcome. The error is set only when the supervisor itself failed.
func (p *Process) Wait() (Result, error) {
	<-p.done
	return p.result, p.err
}

func (p *Process) send(m message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctrl == nil {
		return errors.New("supervise: process has ended")
	}
	if _, err := p.ctrl.Write(m.encode()); err != nil {
		return fmt.Errorf("supervise: %w", err)
	}
	return nil
}

// SetDeadline moves the lease deadline.
func (p *Process) SetDeadline(t time.Time) error {
	return p.send(message{kind: msgDeadline, deadline: MonoOf(t)})
}

// Signal forwards sig to the command's process group.
func (p *Process) Signal(sig syscall.Signal) error {
	return p.send(message{kind: msgSignal, signal: sig})
}

// Stop makes the supervisor SIGKILL the group at once; Wait then reports
// reason as [Result.Killed].
func (p *Process) Stop(reason string) error {
	return p.send(message{kind: msgStop, reason: reason})
}

// Kill sends SIGKILL to the command's process group directly, not through
// the supervisor: the caller's last resort when the lease is lost, in case
// the supervisor was stopped. The supervisor still reaps what is left.
func (p *Process) Kill() {
	if p.pid > 0 {
		_ = unix.Kill(-p.pid, syscall.SIGKILL)
	}
}

// Abandon closes the control pipe, as if this process had died: the
// supervisor sends SIGTERM to the group at once and SIGKILL kill-grace later
// (or by the deadline).
func (p *Process) Abandon() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctrl != nil {
		p.ctrl.Close()
		p.ctrl = nil
	}
}

package main

import (
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is a process the tool started (a lockd node or a Redis server),
// in a process group of its own: its command and a channel closed when it
// has exited, under one mutex.
type proc struct {
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// start starts cmd in a process group of its own (killed if the tool
// dies) and returns a channel closed when it has exited.
func (p *proc) start(cmd *exec.Cmd) (chan struct{}, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return exited, nil
}

// done returns a channel closed when the process last started has
// exited (nil before the first start).
func (p *proc) done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// signal sends sig to the process group.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// kill sends SIGKILL (after SIGCONT, so a paused process dies too) and
// waits until the process is gone, at most 10 s.
func (p *proc) kill() {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	p.signal(syscall.SIGCONT)
	p.signal(syscall.SIGKILL)
	if exited != nil {
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
	}
}

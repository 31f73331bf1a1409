//go:build !linux

package supervise

import "syscall"

// setSubreaper is a no-op where there are no child subreapers: orphaned
// grandchildren that left the group are then not found or reaped.
func setSubreaper() error { return nil }

func descendants(root int) []int { return nil }

func parentOf(int) (int, bool) { return 0, false }

// commandAttr puts the command in a new process group (no Pdeathsig here).
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

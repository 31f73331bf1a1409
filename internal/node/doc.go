// Package node is the Raft side of one lockd node: the parts that follow
// Apply and leadership (the FSM's event fanout, the waiters of queued
// Acquire calls, the watch history, shared leadership checks) and the Raft
// plumbing (logger, disk-fault hook). See DESIGN.md in this folder.
package node

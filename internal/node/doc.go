// Package node is the Raft side of one lockd node: the data dir, Raft and
// its stores, the FSM and what follows Apply (the event fanout, the lease
// timers, the waiters of queued Acquire calls, the watch history),
// leadership, proposals, linearizable reads, membership, the peers' TLS and
// addresses, and the clients to other members. The API layer
// (internal/api, internal/server) calls into it; it never imports them.
// See DESIGN.md in this folder.
package node

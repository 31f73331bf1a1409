// Package wire is the Go client's transport beneath the user concepts of
// package lockd (Client, Session, Mutex, Election, Watch):
//
//   - Endpoints and Node: the servers, and which one a call tries next
//     (the last that answered, a named leader), which answered lately,
//     refused, belong to another cluster or do not speak the API.
//   - Caller.Do: the retry loop, with attempt timeouts, backoff, probes of
//     ports that are not the API and abandoning nodes that stopped
//     answering; Policy says how one call may be retried.
//   - RPC rows, Invoke and the raw Service: how each method is called and
//     checked, from its row of the method table shared with the server
//     (internal/rpcs).
//   - Stream, StreamSlot and Caller.StreamCall: the session stream that
//     carries a client's session calls as frames over one HTTP/2 stream,
//     and the release-request notices of the sessions that subscribed on
//     it (notices.go, Caller.OnNotice).
//   - KAScheduler: the batched keepalives of a client's sessions.
//   - SeqTracker, ConnTracker, the transports and the classification of a
//     failed attempt (retry or not, answered or not).
//
// The lease rule both sides share is in internal/lease.
package wire

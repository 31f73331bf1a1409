// Package wire is the Go client's transport beneath the user concepts of
// package lockd: the request sequence numbers a session's mutations carry,
// the connections it tracks to tell a frozen node from a slow one, its
// HTTP/1.1 and HTTP/2 transports, how a failed attempt is classified
// (retry or not, answered or not, an election under way), and how a round
// of keepalives is cut into session-stream frames. The per-method facts
// (retry class, frame kind) are in internal/rpcs, shared with the server.
package wire

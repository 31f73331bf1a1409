// Package conformance is the language-neutral conformance suite of lockd
// clients. Its test (go test ./conformance) builds lockd, starts real
// `lockd serve` processes (one node, and three for the leader-kill case)
// on 127.0.0.1, and drives a client through a driver program that speaks
// the JSON-lines protocol of DRIVER.md. It checks what a user relies on:
// mutual exclusion and increasing tokens across processes, busy answers
// naming the holder, a paused client giving its lease up before the
// server expires it, one grant after a connection cut mid-acquire, sessions
// surviving a leader kill, refusals by the auth file, and a watch that
// resumes without loss.
//
// The driver is chosen with LOCKD_CONFORMANCE_DRIVER ("cmd args…", split
// on spaces); by default the suite builds and runs the Go client's driver,
// conformance/godriver. The protocol a client must follow is
// docs/protocol.md.
package conformance

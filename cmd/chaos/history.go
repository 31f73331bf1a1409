package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Event kinds. The register records the fenced messages (begin, write,
// end) and the Go workers' lock operations (invoke, return) and lease
// reports (open, lost); the tool records its own faults (fault, heal).
const (
	kindBegin  = "begin"
	kindWrite  = "write"
	kindEnd    = "end"
	kindInvoke = "invoke"
	kindReturn = "return"
	kindOpen   = "open"
	kindLost   = "lost"
	kindFault  = "fault"
	kindHeal   = "heal"
)

// Operations a Go worker records around its client calls.
const (
	opAcquire = "acquire"
	opRelease = "release"
	opClose   = "close"
	// A set of locks taken and released together (MultiLock).
	opAcquireMany = "acquire-many"
	opReleaseMany = "release-many"
)

// Results of a recorded operation. unknown is any error: the client may or
// may not have changed the lock's state (the worker then closes the
// session, so its holds end one way or the other).
const (
	resOK      = "ok"
	resUnknown = "unknown"
	// resDeadlock is an acquire refused with DEADLOCK (lockd.ErrDeadlock):
	// the server queued nothing.
	resDeadlock = "deadlock"
)

// detailRunEnded is the Detail of an unknown result returned because the
// run's end cancelled the call: the client stopped waiting, the server was
// not heard either way.
const detailRunEnded = "the run ended"

// Event is one line of the history: a message the register received, in
// the register's arrival order (Seq), or a fault the tool injected. Times
// are Unix nanoseconds from the one machine's wall clock (all processes of
// a run share it, and the tool never jumps it).
type Event struct {
	// Seq is the register's arrival order, from 1.
	Seq int64 `json:"seq"`
	// At is the arrival time (Unix ns).
	At int64 `json:"at"`
	// Kind is one of the kinds above.
	Kind string `json:"kind"`
	// Slot is the client process slot: w1 (Go worker), r2 (lockd run loop).
	Slot string `json:"slot,omitempty"`
	// Client is one holder identity: slot:session or slot:iteration.
	Client string `json:"client,omitempty"`
	// Session is the lockd session id, when known.
	Session string `json:"session,omitempty"`
	// Lock is the lock name.
	Lock string `json:"lock,omitempty"`
	// Token is the fencing token of a fenced message or a grant.
	Token uint64 `json:"token,omitempty,string"`
	// Accepted tells whether the register accepted a fenced message.
	Accepted bool `json:"accepted,omitempty"`
	// Op is the operation of an invoke or return: acquire, release, close.
	Op string `json:"op,omitempty"`
	// OpID pairs an invoke with its return (per session), and a fault with
	// its heal.
	OpID int64 `json:"opId,omitempty"`
	// Result is ok, unknown or deadlock.
	Result string `json:"result,omitempty"`
	// Sent is the sender's clock when the message left, or when a lease
	// loss was seen (Unix ns).
	Sent int64 `json:"sent,omitempty"`
	// Fault is the fault kind of a fault or heal event.
	Fault string `json:"fault,omitempty"`
	// Target is the faulted node id or client slot ("*": any client).
	Target string `json:"target,omitempty"`
	// Detail says what the tool did, or why a return's result is what
	// it is (the refusal's text, detailRunEnded).
	Detail string `json:"detail,omitempty"`
	// Names are the locks of a set operation (acquire-many,
	// release-many), in the order the worker gave them.
	Names []string `json:"names,omitempty"`
	// Tokens are a granted set's tokens, one per name of Names, all from
	// the one return of the one grant.
	Tokens []uint64 `json:"tokens,omitempty"`
	// Pair tags the operations of one round of a deliberate lock-order
	// inversion: slot:round.
	Pair string `json:"pair,omitempty"`
}

// fenced reports whether the event is one of the register's fenced
// messages.
func (e *Event) fenced() bool {
	return e.Kind == kindBegin || e.Kind == kindWrite || e.Kind == kindEnd
}

// String describes the event in one line, for violation messages.
func (e *Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s", e.Seq, e.Kind)
	for _, kv := range [][2]string{{"slot", e.Slot}, {"client", e.Client}, {"lock", e.Lock}, {"op", e.Op}, {"result", e.Result}, {"fault", e.Fault}, {"target", e.Target}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s=%s", kv[0], kv[1])
		}
	}
	if e.Token != 0 {
		fmt.Fprintf(&b, " token=%d", e.Token)
	}
	if e.fenced() && !e.Accepted {
		b.WriteString(" REJECTED")
	}
	return b.String()
}

// writeHistory writes events as JSON lines: the raw history for replay of
// the checker (chaos check FILE).
func writeHistory(w io.Writer, events []Event) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range events {
		if err := enc.Encode(&events[i]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// readHistory reads a history file written by writeHistory.
func readHistory(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []Event
	dec := json.NewDecoder(bufio.NewReader(f))
	for {
		var e Event
		if err := dec.Decode(&e); err == io.EOF {
			return events, nil
		} else if err != nil {
			return nil, fmt.Errorf("read history %s: %w", path, err)
		}
		events = append(events, e)
	}
}

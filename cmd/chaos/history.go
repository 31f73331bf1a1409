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
)

// Results of a recorded operation. unknown is any error: the client may or
// may not have changed the lock's state (the worker then closes the
// session, so its holds end one way or the other).
const (
	resOK      = "ok"
	resUnknown = "unknown"
)

// Event is one line of the history: a message the register received, in
// the register's arrival order (Seq), or a fault the tool injected. Times
// are Unix nanoseconds from the one machine's wall clock (all processes of
// a run share it, and the tool never jumps it).
type Event struct {
	Seq      int64  `json:"seq"`
	At       int64  `json:"at"`
	Kind     string `json:"kind"`
	Slot     string `json:"slot,omitempty"`    // client process slot: w1 (Go worker), r2 (lockd run loop)
	Client   string `json:"client,omitempty"`  // one holder identity: slot:session or slot:iteration
	Session  string `json:"session,omitempty"` // lockd session id, when known
	Lock     string `json:"lock,omitempty"`
	Token    uint64 `json:"token,omitempty,string"`
	Accepted bool   `json:"accepted,omitempty"`
	Op       string `json:"op,omitempty"`
	OpID     int64  `json:"opId,omitempty"`
	Result   string `json:"result,omitempty"`
	Sent     int64  `json:"sent,omitempty"` // sender's clock when the message left (or when a lease loss was seen)
	Fault    string `json:"fault,omitempty"`
	Target   string `json:"target,omitempty"` // node id or client slot
	Detail   string `json:"detail,omitempty"`
}

// fenced reports whether the event is one of the register's fenced
// messages.
func (e *Event) fenced() bool {
	return e.Kind == kindBegin || e.Kind == kindWrite || e.Kind == kindEnd
}

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

package supervise

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

// The control pipe (lockd run → supervisor, fd 3 in the supervisor) carries
// one message per line:
//
//	d <ns>       the lease deadline is now <ns> (CLOCK_MONOTONIC nanoseconds)
//	s <n>        forward signal n to the command's group
//	k <reason>   stop now: SIGKILL the group, reporting <reason>
//
// The report pipe (supervisor → lockd run, fd 4) carries JSON lines: first a
// report with Event "started" (or the final one when the command could not
// run), then one with Event "exited" when the group is gone.

const (
	controlFD = 3
	reportFD  = 4
)

type msgKind byte

const (
	msgDeadline msgKind = 'd'
	msgSignal   msgKind = 's'
	msgStop     msgKind = 'k'
	msgEOF      msgKind = 0 // the control pipe was closed: lockd run is gone
)

type message struct {
	kind     msgKind
	deadline int64
	signal   syscall.Signal
	reason   string
}

func (m message) encode() []byte {
	switch m.kind {
	case msgDeadline:
		return fmt.Appendf(nil, "d %d\n", m.deadline)
	case msgSignal:
		return fmt.Appendf(nil, "s %d\n", int(m.signal))
	case msgStop:
		// One line: a reason cannot contain a newline.
		return fmt.Appendf(nil, "k %s\n", strings.ReplaceAll(m.reason, "\n", " "))
	}
	panic("supervise: encode of unknown message")
}

func parseMessage(line string) (message, error) {
	if len(line) < 2 || line[1] != ' ' {
		return message{}, fmt.Errorf("malformed control message %q", line)
	}
	arg := line[2:]
	switch msgKind(line[0]) {
	case msgDeadline:
		ns, err := strconv.ParseInt(arg, 10, 64)
		if err != nil {
			return message{}, fmt.Errorf("malformed deadline %q", arg)
		}
		return message{kind: msgDeadline, deadline: ns}, nil
	case msgSignal:
		n, err := strconv.Atoi(arg)
		if err != nil || n <= 0 || n >= 65 {
			return message{}, fmt.Errorf("malformed signal %q", arg)
		}
		return message{kind: msgSignal, signal: syscall.Signal(n)}, nil
	case msgStop:
		return message{kind: msgStop, reason: arg}, nil
	}
	return message{}, fmt.Errorf("unknown control message %q", line)
}

const (
	eventStarted = "started"
	eventExited  = "exited"
)

// report is one line on the report pipe.
type report struct {
	// Event is eventStarted or eventExited.
	Event string `json:"event"`
	Result
}

func encodeReport(r report) []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic("supervise: marshal report: " + err.Error())
	}
	return append(b, '\n')
}

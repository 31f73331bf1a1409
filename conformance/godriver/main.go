// Command godriver is the conformance driver of the Go client: it speaks
// the driver protocol of conformance/DRIVER.md (JSON lines on stdin and
// stdout) and serves each request with the public package
// github.com/lockd-dev/lockd, nothing else, so the conformance suite tests
// the client a Go program gets.
//
// With --broken-ignore-deadline it plays a client that ignores the lease
// rule: it reports a deadline an hour away, answers guarded with its token
// whatever the lease says and never reports a lost lease. The suite's test
// of itself runs it to prove that its pause case catches such a client.
// With --broken-deadline-from-answer it reports a deadline counted from
// when each confirmation arrived rather than from when its request left
// (the lease rule's formula applied to the wrong instant; only this mode
// uses internal/retry, for the formula): the suite's deadline case must
// catch it through a proxy that delays the server's answers.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/lockd-dev/lockd"
)

// version is the driver protocol version this driver speaks.
const version = "1"

func main() {
	broken := flag.Bool("broken-ignore-deadline", false, "ignore the lease deadline (a deliberately broken client, for the suite's self-test)")
	fromAnswer := flag.Bool("broken-deadline-from-answer", false, "report a lease deadline counted from when each confirmation arrived instead of when its request was sent (a deliberately broken client, for the suite's self-test)")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// LOCKD_STREAM=off (or 0, false): every call unary, as the lockd
	// command does; CI runs the suite once each way.
	stream := true
	switch strings.TrimSpace(os.Getenv("LOCKD_STREAM")) {
	case "off", "0", "false":
		stream = false
	}
	opts := []lockd.Option{lockd.WithLogger(logger), lockd.WithStream(stream)}
	if eps := os.Getenv("LOCKD_ENDPOINTS"); eps != "" {
		opts = append(opts, lockd.WithEndpoints(strings.Split(eps, ",")...))
	}
	if tok := os.Getenv("LOCKD_TOKEN"); tok != "" {
		opts = append(opts, lockd.WithToken(tok))
	}
	c, err := lockd.New(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "godriver:", err)
		os.Exit(2)
	}
	d := &driver{c: c, broken: *broken, fromAnswer: *fromAnswer, answered: map[string]time.Time{}, out: json.NewEncoder(os.Stdout),
		sessions: map[string]*lockd.Session{}, locks: map[string]*held{},
		elections: map[string]*lockd.Election{}, streams: map[string]context.CancelFunc{}}
	os.Exit(d.serve(os.Stdin))
}

// driver holds the handles the suite named and writes the answers.
type driver struct {
	c      *lockd.Client
	broken bool
	// fromAnswer plays a client that counts the lease from the arrival of
	// each confirmation: answered holds that wrong deadline by session.
	fromAnswer bool
	answered   map[string]time.Time

	outMu sync.Mutex
	out   *json.Encoder

	mu        sync.Mutex
	sessions  map[string]*lockd.Session
	locks     map[string]*held
	elections map[string]*lockd.Election
	streams   map[string]context.CancelFunc // observe and watch handles
}

// held is a lock handle: one of the client's lock types, and the mode it
// was taken in.
type held struct {
	name   string
	m      *lockd.Mutex
	sem    *lockd.Semaphore
	rw     *lockd.RWMutex
	ml     *lockd.MultiLock // multi_lock: every lock of a set
	shared bool             // rw: taken with RLock
}

// request is one line of the suite: its id, op and the op's arguments.
type request struct {
	ID          int64  `json:"id"`
	Op          string `json:"op"`
	Session     string `json:"session"`
	Lock        string `json:"lock"`
	Election    string `json:"election"`
	Observe     string `json:"observe"`
	Watch       string `json:"watch"`
	Name        string `json:"name"`
	Owner       string `json:"owner"`
	Value       string `json:"value"`
	Prefix      string `json:"prefix"`
	From        string `json:"from"`
	TTLMs       int64  `json:"ttl_ms"`
	TimeoutMs   int64  `json:"timeout_ms"`
	RetentionMs int64  `json:"retention_ms"`
	Permits     uint32 `json:"permits"`
	Token       uint64 `json:"token"`
	Try         bool   `json:"try"`
	MaxHoldMs   int64  `json:"max_hold_ms"`
	// Names and Modes are multi_lock's set (modes: exclusive only).
	Names []string `json:"names"`
	Modes []string `json:"modes"`
}

// failure is an op's error with its protocol code.
type failure struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Holder  string `json:"holder,omitempty"`
}

func (f *failure) Error() string { return f.Code + ": " + f.Message }

func fail(code, format string, a ...any) error {
	return &failure{Code: code, Message: fmt.Sprintf(format, a...)}
}

// serve reads requests until stdin ends or an exit request, serving each
// on its own goroutine.
func (d *driver) serve(in *os.File) int {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var wg sync.WaitGroup
	for sc.Scan() {
		var r request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			d.write(map[string]any{"ok": false, "error": &failure{Code: "invalid", Message: "bad request line: " + err.Error()}})
			continue
		}
		if r.Op == "exit" {
			wg.Wait()
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := d.c.Close(ctx)
			cancel()
			d.answer(r.ID, t0, nil, err)
			return 0
		}
		wg.Go(func() {
			t0 := time.Now()
			res, err := d.do(r)
			d.answer(r.ID, t0, res, err)
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = d.c.Close(ctx)
	return 0
}

// answer writes the answer to request id: res on success, err mapped to
// its code otherwise.
func (d *driver) answer(id int64, t0 time.Time, res map[string]any, err error) {
	t1 := time.Now()
	m := map[string]any{"id": id, "t0": t0.UnixNano(), "t1": t1.UnixNano()}
	if err != nil {
		m["ok"] = false
		m["error"] = toFailure(err)
	} else {
		m["ok"] = true
		for k, v := range res {
			m[k] = v
		}
	}
	d.write(m)
}

// event writes an unsolicited event.
func (d *driver) event(m map[string]any) {
	m["t"] = time.Now().UnixNano()
	d.write(m)
}

func (d *driver) write(m map[string]any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	if err := d.out.Encode(m); err != nil {
		fmt.Fprintln(os.Stderr, "godriver: write:", err)
	}
}

// toFailure maps a client error to the protocol's codes. The lease comes
// first: a wait ended by a lost lease is lease_lost, not a timeout.
func toFailure(err error) *failure {
	var f *failure
	if errors.As(err, &f) {
		return f
	}
	msg := err.Error()
	var be *lockd.BusyError
	if errors.As(err, &be) {
		holder := ""
		if len(be.Holders) > 0 {
			holder = be.Holders[0].Owner
		}
		return &failure{Code: "busy", Message: msg, Holder: holder}
	}
	codes := []struct {
		err  error
		code string
	}{
		{lockd.ErrLeaseLost, "lease_lost"},
		{lockd.ErrHoldExpired, "lease_lost"},
		{lockd.ErrSessionClosed, "lease_lost"},
		{lockd.ErrPermissionDenied, "permission_denied"},
		{lockd.ErrUnauthenticated, "unauthenticated"},
		{lockd.ErrAlreadyDone, "done"},
		{lockd.ErrAlreadyHeld, "already_held"},
		{lockd.ErrNotHeld, "not_held"},
		{lockd.ErrInvalidArgument, "invalid"},
		{lockd.ErrLimitMismatch, "invalid"},
		{lockd.ErrNoLeader, "not_found"},
		{lockd.ErrDeadlock, "deadlock"},
		{context.DeadlineExceeded, "deadline"},
		{context.Canceled, "cancelled"},
		{lockd.ErrUnavailable, "unavailable"},
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return &failure{Code: c.code, Message: msg}
		}
	}
	return &failure{Code: "other", Message: msg}
}

// timeout returns a context bounded by ms (none when 0).
func timeout(ms int64) (context.Context, context.CancelFunc) {
	if ms <= 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
}

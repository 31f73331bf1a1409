package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// register is the fenced resource: clients write to it inside their
// critical sections, each message carrying the lock's fencing token. It
// rejects a message whose token is lower than the highest it has accepted
// for that lock (a stale holder), and records every message it receives,
// accepted or not, in arrival order. The Go workers also report their lock
// operations to it, so one sequence orders everything the checker sees.
type register struct {
	mu       sync.Mutex
	events   []Event
	max      map[string]uint64 // lock → highest accepted token
	srv      *http.Server
	ln       net.Listener
	closed   bool
	limit    int               // bound on recorded events: a runaway client cannot eat memory
	lastLock map[string]string // slot → lock of its last fenced message
	inCS     map[string]bool   // slot → in a critical section (its last message an accepted begin or write)
	unfenced bool              // Redlock: messages carry no token (0) and are all accepted
}

// maxEvents bounds one run's history.
const maxEvents = 2_000_000

func newRegister() *register {
	return &register{max: map[string]uint64{}, limit: maxEvents, inCS: map[string]bool{}, lastLock: map[string]string{}}
}

// start serves the register on a free port of 127.0.0.1 and returns its URL.
func (r *register) start() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	r.ln = ln
	mux := http.NewServeMux()
	mux.HandleFunc("POST /event", r.handle)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

func (r *register) stop() {
	if r.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = r.srv.Shutdown(ctx)
	}
}

// handle records one message. The answer for a fenced message is 200 when
// accepted and 409 when rejected as stale.
func (r *register) handle(w http.ResponseWriter, req *http.Request) {
	var e Event
	if err := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<16)).Decode(&e); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ok, err := r.record(e)
	switch {
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	case !ok:
		w.WriteHeader(http.StatusConflict)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

var errHistoryFull = errors.New("history full")

// record stamps e with its arrival order and time, decides a fenced
// message, and appends it. It reports whether a fenced message was
// accepted (true for other kinds).
func (r *register) record(e Event) (bool, error) {
	return r.recordAt(e, time.Now().UnixNano())
}

// recordAt is record with the arrival time given (tests plant histories).
func (r *register) recordAt(e Event, at int64) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || len(r.events) >= r.limit {
		return false, errHistoryFull
	}
	e.Seq = int64(len(r.events)) + 1
	e.At = at
	if e.fenced() {
		// Token 0 is no token: rejected, except from a backend that
		// issues none (Redlock), whose holders nothing can fence.
		e.Accepted = e.Token != 0 && e.Token >= r.max[e.Lock] || r.unfenced && e.Token == 0
		if e.Accepted {
			r.max[e.Lock] = e.Token
		}
		r.inCS[e.Slot] = e.Accepted && e.Kind != kindEnd
		r.lastLock[e.Slot] = e.Lock
	}
	r.events = append(r.events, e)
	return !e.fenced() || e.Accepted, nil
}

// holding lists the slots in a critical section now, sorted.
func (r *register) holding() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for s, in := range r.inCS {
		if in {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// lockOf returns the lock of the slot's last fenced message.
func (r *register) lockOf(slot string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastLock[slot]
}

// close stops recording and returns the history.
func (r *register) close() []Event {
	r.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return r.events
}

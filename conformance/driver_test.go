package conformance

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// driver is one driver process speaking DRIVER.md.
type driver struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser

	mu      sync.Mutex
	nextID  int64
	pending map[int64]chan answer
	events  []map[string]any
	changed chan struct{} // closed and replaced when events grow
	caps    []string
	exited  chan struct{}
	stderr  *os.File
}

// answer is a driver's answer: ok or an error with its code.
type answer struct {
	OK     bool            `json:"ok"`
	Error  *driverError    `json:"error"`
	T0     int64           `json:"t0"`
	T1     int64           `json:"t1"`
	Fields map[string]any  `json:"-"`
	Raw    json.RawMessage `json:"-"`
}

type driverError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Holder  string `json:"holder"`
}

// code returns the answer's error code, "" when ok.
func (a answer) code() string {
	if a.OK || a.Error == nil {
		return ""
	}
	return a.Error.Code
}

func (a answer) String() string { return string(a.Raw) }

// num returns a numeric result field.
func (a answer) num(k string) uint64 { return numOf(a.Fields, k) }

func (a answer) str(k string) string {
	s, _ := a.Fields[k].(string)
	return s
}

// startDriver starts a driver (argv) against endpoints, with an optional
// bearer token, and says hello.
func startDriver(t *testing.T, name string, argv []string, endpoints, token string) *driver {
	t.Helper()
	needBinaries(t)
	d := &driver{t: t, name: name, pending: map[int64]chan answer{}, changed: make(chan struct{}), exited: make(chan struct{})}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Env = append(os.Environ(), "LOCKD_ENDPOINTS="+endpoints)
	if token != "" {
		d.cmd.Env = append(d.cmd.Env, "LOCKD_TOKEN="+token)
	}
	var err error
	if d.stderr, err = os.CreateTemp(t.TempDir(), name+"-*.log"); err != nil {
		t.Fatal(err)
	}
	d.cmd.Stderr = d.stderr
	if d.in, err = d.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start driver %v: %v", argv, err)
	}
	go d.read(out)
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGCONT)
		_ = d.in.Close()
		select {
		case <-d.exited:
		case <-time.After(5 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(d.stderr.Name())
			if len(b) > 0 {
				t.Logf("driver %s stderr:\n%s", name, tail(b, 3000))
			}
		}
	})
	a := d.call(map[string]any{"op": "hello"}, 30*time.Second)
	if !a.OK {
		t.Fatalf("driver %s: hello: %s", name, a)
	}
	if caps, ok := a.Fields["capabilities"].([]any); ok {
		for _, c := range caps {
			if s, ok := c.(string); ok {
				d.caps = append(d.caps, s)
			}
		}
	}
	return d
}

// read dispatches answers by id and keeps events, until stdout ends.
func (d *driver) read(out io.Reader) {
	defer close(d.exited)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := slices.Clone(sc.Bytes())
		var head struct {
			ID    *int64 `json:"id"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &head); err != nil {
			continue
		}
		fields := map[string]any{}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		_ = dec.Decode(&fields)
		if head.ID == nil {
			d.mu.Lock()
			d.events = append(d.events, fields)
			close(d.changed)
			d.changed = make(chan struct{})
			d.mu.Unlock()
			continue
		}
		var a answer
		_ = json.Unmarshal(line, &a)
		a.Fields, a.Raw = fields, line
		d.mu.Lock()
		ch := d.pending[*head.ID]
		delete(d.pending, *head.ID)
		d.mu.Unlock()
		if ch != nil {
			ch <- a
		}
	}
	_ = d.cmd.Wait()
	d.mu.Lock()
	for id, ch := range d.pending {
		ch <- answer{Error: &driverError{Code: "driver_exited", Message: "the driver exited"}}
		delete(d.pending, id)
	}
	d.mu.Unlock()
}

// send writes a request and returns the channel its answer comes on.
func (d *driver) send(req map[string]any) <-chan answer {
	ch := make(chan answer, 1)
	d.mu.Lock()
	d.nextID++
	id := d.nextID
	d.pending[id] = ch
	d.mu.Unlock()
	req["id"] = id
	b, _ := json.Marshal(req)
	if _, err := d.in.Write(append(b, '\n')); err != nil {
		d.mu.Lock()
		delete(d.pending, id)
		d.mu.Unlock()
		ch <- answer{Error: &driverError{Code: "driver_exited", Message: err.Error()}}
	}
	return ch
}

// call sends a request and waits for its answer; a driver that does not
// answer within wait fails the test (a hung client is a failure too).
func (d *driver) call(req map[string]any, wait time.Duration) answer {
	d.t.Helper()
	op := req["op"]
	select {
	case a := <-d.send(req):
		if a.code() == "driver_exited" {
			d.t.Fatalf("driver %s exited during %v", d.name, op)
		}
		return a
	case <-time.After(wait):
		d.t.Fatalf("driver %s: no answer to %v within %v", d.name, op, wait)
	}
	return answer{}
}

// must is call that fails the test unless the answer is ok.
func (d *driver) must(req map[string]any) answer {
	d.t.Helper()
	a := d.call(req, 60*time.Second)
	if !a.OK {
		d.t.Fatalf("driver %s: %v: %s", d.name, req["op"], a)
	}
	return a
}

// has reports whether the driver announced a capability.
func (d *driver) has(c string) bool { return slices.Contains(d.caps, c) }

// waitEvent waits for an event matching cond and returns it.
func (d *driver) waitEvent(timeout time.Duration, cond func(map[string]any) bool) (map[string]any, bool) {
	end := time.After(timeout)
	seen := 0
	for {
		d.mu.Lock()
		evs, ch := d.events[seen:], d.changed
		seen = len(d.events)
		d.mu.Unlock()
		for _, e := range evs {
			if cond(e) {
				return e, true
			}
		}
		select {
		case <-ch:
		case <-end:
			return nil, false
		}
	}
}

// eventsOf returns the events so far matching cond.
func (d *driver) eventsOf(cond func(map[string]any) bool) []map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []map[string]any
	for _, e := range d.events {
		if cond(e) {
			out = append(out, e)
		}
	}
	return out
}

func (d *driver) pause(t *testing.T) {
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

func (d *driver) resume(t *testing.T) {
	if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// numOf reads a JSON number field of an event or answer.
func numOf(m map[string]any, k string) uint64 {
	if v, ok := m[k].(json.Number); ok {
		var x uint64
		if _, err := fmt.Sscan(v.String(), &x); err == nil {
			return x
		}
	}
	return 0
}

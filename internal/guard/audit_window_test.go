package guard

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
)

// lockedBuffer is an io.Writer whose lines can be read while it is written.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) entries(t *testing.T) []AuditEntry {
	w.mu.Lock()
	defer w.mu.Unlock()
	var es []AuditEntry
	for _, line := range bytes.Split(bytes.TrimSpace(w.b.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var e AuditEntry
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		es = append(es, e)
	}
	return es
}

// TestAuditLimitWindows checks the aggregation of limit refusals in the
// audit log: the first refusal of an identity and operation is a line at
// once, the next ones in the window one line with their count when it
// ends; other identities, other operations and admin operations keep
// their own lines; closing the log writes the open windows' lines.
func TestAuditLimitWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuffer
		l := &auditLog{node: "n1", w: &buf}
		flooder := context.WithValue(t.Context(), callerKey{}, caller{identity: "flooder", known: true, addr: "10.0.0.7:4000"})
		other := context.WithValue(t.Context(), callerKey{}, caller{identity: "other", known: true, addr: "10.0.0.8:4000"})
		refused := &LimitError{ce: connect.NewError(connect.CodeResourceExhausted, errString("rate limit of flooder reached"))}
		acquire := &access{op: "Acquire", name: "hot"}
		for range 1000 {
			l.limitRefused(flooder, acquire, refused)
		}
		l.limitRefused(flooder, &access{op: "Release", name: "hot"}, refused)
		l.limitRefused(other, acquire, refused)
		l.record(flooder, &access{op: "ForceRelease", name: "hot", admin: true}, nil)
		es := buf.entries(t)
		if len(es) != 4 {
			t.Fatalf("%d lines before the window ends, want 4 (one per identity and op, the admin op)", len(es))
		}
		for _, e := range es[:3] {
			if e.Outcome != "refused" || e.Code != "resource_exhausted" || e.Count != 0 {
				t.Errorf("first refusal line %+v", e)
			}
		}
		if es[3].Op != "ForceRelease" || es[3].Outcome != "ok" {
			t.Errorf("admin line %+v", es[3])
		}

		time.Sleep(auditWindow)
		synctest.Wait()
		es = buf.entries(t)
		if len(es) != 5 {
			t.Fatalf("%d lines after the window, want 5", len(es))
		}
		if e := es[4]; e.Identity != "flooder" || e.Op != "Acquire" || e.Count != 999 || e.Since == nil || !e.Since.Before(e.Time) || e.Lock != "hot" {
			t.Errorf("count line %+v, want flooder Acquire count 999 since before time", e)
		}

		// A new window: its first refusal is a line again; close writes the count.
		for range 3 {
			l.limitRefused(flooder, acquire, refused)
		}
		if n := len(buf.entries(t)); n != 6 {
			t.Fatalf("%d lines, want 6", n)
		}
		l.flush()
		es = buf.entries(t)
		if len(es) != 7 || es[6].Count != 2 {
			t.Fatalf("after flush: %+v, want a last line with count 2", es)
		}
		l.limitRefused(flooder, acquire, refused) // after close: a line each
		if n := len(buf.entries(t)); n != 8 {
			t.Fatalf("%d lines after a refusal past close, want 8", n)
		}
	})
}

type errString string

func (e errString) Error() string { return string(e) }

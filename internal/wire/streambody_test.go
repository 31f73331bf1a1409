package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
)

// envelope returns a Connect/gRPC envelope of msg.
func envelope(msg []byte) []byte {
	e := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(e[1:], uint32(len(msg)))
	return append(e, msg...)
}

// writeLikeConnect writes each message into w as connect does: the
// prefix, then the message (even when empty), each its own write.
func writeLikeConnect(w *io.PipeWriter, msgs [][]byte) {
	for _, m := range msgs {
		e := envelope(m)
		if _, err := w.Write(e[:5]); err != nil {
			return
		}
		if _, err := w.Write(e[5:]); err != nil {
			return
		}
	}
	w.Close()
}

func TestEnvelopeBodyReadsWholeEnvelopes(t *testing.T) {
	msgs := [][]byte{[]byte("acquire"), {}, bytes.Repeat([]byte("k"), 300), []byte("release")}
	pr, pw := io.Pipe()
	go writeLikeConnect(pw, msgs)
	b := &envelopeBody{r: pr}
	buf := make([]byte, 4096)
	for i, m := range msgs {
		n, err := b.Read(buf)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if want := envelope(m); !bytes.Equal(buf[:n], want) {
			t.Fatalf("read %d = %q, want the whole envelope %q", i, buf[:n], want)
		}
	}
	if n, err := b.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the last envelope: %d, %v; want 0, EOF", n, err)
	}
}

func TestEnvelopeBodySmallBuffer(t *testing.T) {
	// An envelope larger than the reader's buffer comes in pieces, and
	// the bytes are the stream's, in order.
	msgs := [][]byte{bytes.Repeat([]byte("a"), 50), []byte("b"), bytes.Repeat([]byte("c"), 33)}
	pr, pw := io.Pipe()
	go writeLikeConnect(pw, msgs)
	b := &envelopeBody{r: pr}
	var got []byte
	buf := make([]byte, 7)
	for {
		n, err := b.Read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var want []byte
	for _, m := range msgs {
		want = append(want, envelope(m)...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestStreamHTTPClientWrapsOnlyTheStream(t *testing.T) {
	var seen []io.ReadCloser
	next := doFunc(func(r *http.Request) (*http.Response, error) {
		seen = append(seen, r.Body)
		return nil, errors.New("not sent")
	})
	c := StreamHTTPClient(next)
	pr, _ := io.Pipe()
	stream := &http.Request{URL: &url.URL{Path: "/lockd.v1.SessionService/Stream"}, Body: pr}
	unary := &http.Request{URL: &url.URL{Path: "/lockd.v1.SessionService/CreateSession"}, Body: pr}
	_, _ = c.Do(stream)
	_, _ = c.Do(unary)
	if _, ok := seen[0].(*envelopeBody); !ok {
		t.Errorf("stream body %T, want *envelopeBody", seen[0])
	}
	if seen[1] != io.ReadCloser(pr) {
		t.Errorf("unary body %T, want the request's own", seen[1])
	}
}

// doFunc is a connect.HTTPClient of a function: it records what the
// wrapper passes on (no request is sent anywhere).
type doFunc func(*http.Request) (*http.Response, error)

func (f doFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

func TestEnvelopeBodyReadsABatchWhole(t *testing.T) {
	// A sender's batch (the hint says how many follow, as sendQueued
	// sets it) comes in one read; the next batch in the next.
	batches := [][][]byte{{[]byte("one"), {}, []byte("three")}, {[]byte("four")}}
	pr, pw := io.Pipe()
	more := new(atomic.Int32)
	go func() {
		for _, b := range batches {
			for i, m := range b {
				more.Store(int32(len(b) - 1 - i))
				writeEnvelope(pw, m)
			}
			more.Store(0)
		}
		pw.Close()
	}()
	b := &envelopeBody{r: pr, more: more}
	buf := make([]byte, 4096)
	for i, batch := range batches {
		var want []byte
		for _, m := range batch {
			want = append(want, envelope(m)...)
		}
		n, err := b.Read(buf)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], want) {
			t.Fatalf("read %d = %q, want the batch %q", i, buf[:n], want)
		}
	}
}

// writeEnvelope writes one message as connect does: prefix, then bytes.
func writeEnvelope(w *io.PipeWriter, m []byte) {
	e := envelope(m)
	_, _ = w.Write(e[:5])
	_, _ = w.Write(e[5:])
}

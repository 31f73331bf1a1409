package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/lockd-dev/lockd/internal/fsm"
	"github.com/lockd-dev/lockd/internal/node"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

// The watch stream, served two ways from one loop (streamEvents): the Connect
// server stream WatchService.Watch and Server-Sent Events on GET /v1/watch.
// Any node serves it from its own applied log; see docs/events.md.

// watchKeepalive (a variable for tests) is how often an idle watch stream
// sends a keepalive (an SSE comment, or an event without a kind on the
// Connect stream), so proxies keep it open and clients notice a dead server.
var watchKeepalive = 15 * time.Second

// errServerClosing ends the streams of a node that shuts down, so clients
// reconnect elsewhere.
var errServerClosing = errors.New("node shutting down")

// errNoClusterYet refuses a position while this node does not know its
// cluster's id (a new node before its first entries): it cannot tell
// whether the position is of its cluster.
var errNoClusterYet = errors.New("node has no cluster id yet; it cannot check the position")

// wirePos is p as clients see it: "INDEX.N@TAG", TAG the start of the
// cluster id, so a position is never resumed against another cluster's
// log (see parseFrom). Before the node knows its cluster id it has no tag.
func (s watchAPI) wirePos(p node.Pos) string {
	if tag := node.ClusterTag(s.fsm.ClusterID()); tag != "" {
		return p.String() + "@" + tag
	}
	return p.String()
}

// parseFrom reads a stream's from: the cursor, and whether the stream must
// start with a reset because the position does not belong to this
// cluster's log: another cluster's tag (a saved position resumed against a
// cluster restored from backup, or a wrong endpoint), no tag (a position
// from a server before the tag, or written by hand), or node.ResetFrom. A
// position at index 0 ("from the start") means the same in every cluster
// and is taken with or without a tag.
func (s watchAPI) parseFrom(from string) (cursor node.Pos, reset bool, err error) {
	if from == node.ResetFrom {
		return s.hub.Now(), true, nil
	}
	p, tag, err := node.ParseTaggedPos(from)
	if err != nil {
		return node.Pos{}, false, err
	}
	if p.Index == 0 {
		return p, false, nil
	}
	own := node.ClusterTag(s.fsm.ClusterID())
	switch {
	case tag == "":
		return p, true, nil
	case own == "":
		return node.Pos{}, false, errNoClusterYet
	case tag != own:
		return p, true, nil
	}
	return p, false, nil
}

// streamEvents streams the events after from ("" for now) of the locks under
// prefix until ctx ends, calling send for each (it blocks on the consumer)
// and idle with the cursor at the start and then every s.keepalive while
// nothing is sent. After a reset it goes on from the reset's position.
func (s watchAPI) streamEvents(ctx context.Context, prefix, from string, state bool, send func(*lockdv1.WatchResponse) error, idle func(cursor string) error) error {
	cursor := s.hub.Now()
	foreign := false // from is not a position of this log: reset first
	if from != "" {
		p, reset, err := s.parseFrom(from)
		if err != nil {
			return err
		}
		cursor, foreign = p, reset
	} else if state {
		at, err := s.sendState(prefix, nil, send)
		if err != nil {
			return err
		}
		cursor = at
	}
	s.metrics.watchStreams.Inc()
	defer s.metrics.watchStreams.Dec()
	// The caller was judged when the stream opened (guard); it is judged
	// again when the auth rules change, so a revoked token or a narrowed
	// grant ends the stream (PERMISSION_DENIED) instead of keeping it.
	aw, err := s.guard.WatchAuth(ctx, &lockdv1.WatchRequest{Prefix: prefix}, "Watch")
	if err != nil {
		return err // the rules changed after guard's check, before aw saw them
	}
	// A first keepalive tells the client where the stream starts, so a
	// stream cut before its first event resumes from there, not from a
	// later "now". Not before a reset: the client keeps its own from then,
	// and gets the reset again if the stream is cut before it.
	if !foreign {
		if err := idle(s.wirePos(cursor)); err != nil {
			return err
		}
	}
	buf := make([]fsm.Event, 0, s.cfg.WatchBuffer)
	tick := time.NewTicker(s.keepalive)
	defer tick.Stop()
	for {
		if err := aw.Check(ctx); err != nil {
			return err
		}
		var r node.ReadResult
		if foreign {
			foreign = false
			r = node.ReadResult{Reset: true, Next: s.hub.Now()}
		} else {
			r = s.hub.Read(cursor, prefix, buf)
		}
		if r.Reset {
			s.metrics.watchResets.Inc()
			reset := &lockdv1.WatchResponse{Position: s.wirePos(r.Next), Kind: lockdv1.EventKind_EVENT_KIND_RESET}
			if !state {
				if err := send(reset); err != nil {
					return err
				}
				cursor = r.Next
				continue
			}
			at, err := s.sendState(prefix, reset, send)
			if err != nil {
				return err
			}
			cursor = at
			continue
		}
		for i := range r.Events {
			m := eventPB(&r.Events[i])
			m.Position = s.wirePos(node.EventPos(&r.Events[i]))
			m.EntryEnd = i == len(r.Events)-1 || r.Events[i+1].Index != r.Events[i].Index
			if err := send(m); err != nil {
				return err
			}
		}
		clear(r.Events) // drop the values' references
		cursor = r.Next
		if r.Wait == nil {
			continue
		}
		select {
		case <-r.Wait:
		case <-tick.C:
			if err := idle(s.wirePos(cursor)); err != nil {
				return err
			}
		case <-aw.Changed():
		case <-ctx.Done():
			return nil
		case <-s.done:
			return errServerClosing
		}
	}
}

// sendState sends the holds under prefix as they are, at a position read
// with them: first (when not nil) the reset, moved to that position, then
// one HELD event per hold and a SYNCED event. It returns the position.
func (s watchAPI) sendState(prefix string, reset *lockdv1.WatchResponse, send func(*lockdv1.WatchResponse) error) (node.Pos, error) {
	var evs []fsm.Event
	var at node.Pos
	s.fsm.Holding(prefix, func(held []fsm.Event) {
		// Apply publishes events with the FSM's lock held, so none can
		// come between these holds and this position.
		evs, at = held, s.hub.Now()
	})
	p := s.wirePos(at)
	if reset != nil {
		reset.Position = p
		if err := send(reset); err != nil {
			return at, err
		}
	}
	for i := range evs {
		m := eventPB(&evs[i])
		m.Position = p
		if err := send(m); err != nil {
			return at, err
		}
	}
	return at, send(&lockdv1.WatchResponse{Position: p, Kind: lockdv1.EventKind_EVENT_KIND_SYNCED})
}

// eventPB is e on the wire, without its position (Server.wirePos).
func eventPB(e *fsm.Event) *lockdv1.WatchResponse {
	return &lockdv1.WatchResponse{
		Kind:    lockdv1.EventKind(e.Kind),
		Name:    e.Name,
		Session: e.Session,
		Owner:   e.Owner,
		Token:   e.Token,
		Mode:    lockdv1.Mode(e.Mode),
		Limit:   e.Limit,
		Value:   e.Value,
	}
}

// watchAPI implements lockdv1connect.WatchServiceHandler.
type watchAPI struct{ *Server }

var _ lockdv1connect.WatchServiceHandler = watchAPI{}

// Watch implements lockdv1connect.WatchServiceHandler. An idle stream gets
// an event without a kind whose position is the stream's cursor.
func (w watchAPI) Watch(ctx context.Context, req *connect.Request[lockdv1.WatchRequest], stream *connect.ServerStream[lockdv1.WatchResponse]) error {
	// A stream passes no unary interceptor: guard it here (read on the
	// prefix).
	err := w.guard.Run(ctx, req.Msg, "Watch", func(ctx context.Context) error {
		return w.streamEvents(ctx, req.Msg.Prefix, req.Msg.From, req.Msg.State, stream.Send, func(cursor string) error {
			return stream.Send(&lockdv1.WatchResponse{Position: cursor})
		})
	})
	switch {
	case errors.Is(err, node.ErrBadPosition):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, errServerClosing), errors.Is(err, errNoClusterYet):
		return connect.NewError(connect.CodeUnavailable, err)
	}
	return err
}

var sseJSON = protojson.MarshalOptions{EmitUnpopulated: true}

// serveWatchSSE serves GET /v1/watch?prefix=P&from=POS[&state=1] as
// Server-Sent Events: each event is an "id: POS" line (so a browser's
// EventSource resumes by itself with Last-Event-ID) and a "data: JSON" line
// (protojson of WatchResponse); a reset is "event: reset" with data
// {"position":…}, the end of a state dump "event: synced" likewise;
// ": keepalive" comments keep an idle stream open.
//
// An id is written only where resuming from it is exact: on changes, on
// synced, and on a reset without state. The held events of a state dump
// have none, so a browser that reconnects during the first dump sends no
// Last-Event-ID (or the one before it) and gets the dump again; a reset
// that a dump follows has the id node.ResetFrom, so a reconnect during that dump
// gets the reset and the dump again. Never a part of a state.
func (s watchAPI) serveWatchSSE(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	// Last-Event-ID first: the browser sends it when its EventSource
	// reconnects by itself, to the same URL, so it is later than the URL's
	// from.
	from := r.Header.Get("Last-Event-ID")
	if from == "" {
		from = q.Get("from")
	}
	state := q.Get("state") == "1" || q.Get("state") == "true"
	if from != "" {
		if _, _, err := s.parseFrom(from); err != nil {
			code := http.StatusBadRequest
			if errors.Is(err, errNoClusterYet) {
				code = http.StatusServiceUnavailable
			}
			http.Error(w, "from: "+err.Error(), code)
			return
		}
	}
	called := false
	err := s.guard.Run(r.Context(), &lockdv1.WatchRequest{Prefix: q.Get("prefix")}, "Watch", func(context.Context) error {
		called = true
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
		w.WriteHeader(http.StatusOK)
		if err := rc.Flush(); err != nil {
			return err
		}
		send := func(ev *lockdv1.WatchResponse) error {
			var err error
			switch ev.Kind {
			case lockdv1.EventKind_EVENT_KIND_RESET:
				id := ev.Position
				if state {
					id = node.ResetFrom // a dump follows: exact only after its synced
				}
				_, err = fmt.Fprintf(w, "id: %s\nevent: reset\ndata: {\"position\":%q}\n\n", id, ev.Position)
			case lockdv1.EventKind_EVENT_KIND_SYNCED:
				_, err = fmt.Fprintf(w, "id: %s\nevent: synced\ndata: {\"position\":%q}\n\n", ev.Position, ev.Position)
			case lockdv1.EventKind_EVENT_KIND_HELD:
				// No id: a part of a dump is no place to resume from.
				err = writeSSEData(w, "", ev)
			default:
				err = writeSSEData(w, ev.Position, ev)
			}
			if err != nil {
				return err
			}
			return rc.Flush()
		}
		return s.streamEvents(r.Context(), q.Get("prefix"), from, state, send, func(string) error {
			if _, err := w.Write([]byte(": keepalive\n\n")); err != nil {
				return err
			}
			return rc.Flush()
		})
	})
	if err != nil && !called {
		// Refused: the same status codes Connect uses for these codes.
		http.Error(w, err.Error(), connectHTTPStatus(connect.CodeOf(err)))
		return
	}
	if err != nil && !errors.Is(err, errServerClosing) {
		s.log.Debug("watch stream ended", "err", err)
	}
}

// writeSSEData writes ev as an SSE message: an "id:" line when id is not
// "", and a "data:" line with its compact protojson.
func writeSSEData(w http.ResponseWriter, id string, ev *lockdv1.WatchResponse) error {
	b, err := sseJSON.Marshal(ev)
	if err != nil {
		return err
	}
	// protojson varies its spacing on purpose; a stream for curl and
	// browsers is easier to read (and grep) compact.
	var c bytes.Buffer
	if err := json.Compact(&c, b); err != nil {
		return err
	}
	if id != "" {
		_, err = fmt.Fprintf(w, "id: %s\ndata: %s\n\n", id, c.Bytes())
	} else {
		_, err = fmt.Fprintf(w, "data: %s\n\n", c.Bytes())
	}
	return err
}

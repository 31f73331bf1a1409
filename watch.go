package lockd

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/endpoint"
	"github.com/lockd-dev/lockd/internal/retry"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"

	"github.com/lockd-dev/lockd/internal/wire"
)

// EventKind is what happened to a lock (see Event).
type EventKind int32

// Event kinds: the numbers of lockd.v1.EventKind.
const (
	// EventGranted: a session got the lock (at once or from the queue).
	EventGranted EventKind = 1
	// EventReleased: the holder released it (release, cancel, close).
	EventReleased EventKind = 2
	// EventExpired: the holder's session expired while holding.
	EventExpired EventKind = 3
	// EventQueued: a session queued for the lock.
	EventQueued EventKind = 4
	// EventDequeued: a queued session left without a grant.
	EventDequeued EventKind = 5
	// EventCompleted: the holder marked the job done (the hold ended).
	EventCompleted EventKind = 6
	// EventMarkCleared: the completion mark ended.
	EventMarkCleared EventKind = 7
	// EventDelayStarted: a lock-delay started after an expired holder.
	EventDelayStarted EventKind = 8
	// EventDelayEnded: the lock-delay ended.
	EventDelayEnded EventKind = 9
	// EventForceReleased: the holder's force-released session ended.
	EventForceReleased EventKind = 10
	// EventValueChanged: the holder changed its value (Proclaim).
	EventValueChanged EventKind = 11
	// EventHoldExpired: the hold's budget (WithMaxHold, a lock policy, an
	// identity's ceiling) ran out; the leader ended it as an expiry does,
	// while its session lives on.
	EventHoldExpired EventKind = 12
	// EventReleaseRequested: someone asked the holder (Session, Token) to
	// let go (RequestRelease); Value is the reason. Nothing changed.
	EventReleaseRequested EventKind = 13
	// EventReset: not a lock event; events were lost (see ErrWatchReset).
	EventReset EventKind = 100
	// EventHeld: not a change; a hold as it is at the event's position
	// (WatchState).
	EventHeld EventKind = 101
	// EventSynced: not a change; the end of the state (WatchState).
	EventSynced EventKind = 102
)

// String returns the kind's name, as `lockd watch` prints it.
func (k EventKind) String() string {
	name, ok := lockdv1.EventKind_name[int32(k)]
	if !ok {
		return fmt.Sprintf("EventKind(%d)", int32(k))
	}
	return name[len("EVENT_KIND_"):]
}

// Event is one change of one lock, in the order the cluster's log applied
// it. Every node reports the same events with the same positions.
type Event struct {
	// Position is the event's opaque cursor ("INDEX.N@CLUSTER"); WatchFrom resumes
	// after it.
	Position string
	// Kind is what happened.
	Kind EventKind
	// Name is the lock's name.
	Name string
	// Session and Owner are the session concerned and its owner label.
	Session, Owner string
	// Token is the hold's token (the mark's or the expired hold's for mark
	// and delay events; 0 for queue events).
	Token uint64
	// Shared is true for a shared hold or wait (RWMutex.RLock, Semaphore).
	Shared bool
	// Limit is the lock's limit: 1 for a mutex, more for a semaphore.
	Limit uint32
	// Value is the hold's or wait's value (granted, queued, value changed),
	// or a release request's reason.
	Value []byte
	// EntryEnd is set on the last event of its log entry: one entry can
	// change many locks, or one lock twice (a release and the grant to the
	// next waiter). Show a state only at an EntryEnd, so as never to show
	// one that was never there.
	EntryEnd bool
}

// WatchOption configures Watch.
type WatchOption func(*watchConfig)

type watchConfig struct {
	from  string
	state bool
}

// WatchState starts the watch with the state: an EventHeld for each hold
// of the matching locks, then an EventSynced, all at one position, then
// the events after it; and sends the state again after every reset, so
// the caller never has to list the locks itself. With WatchFrom, the state
// comes only after a reset. The server scans the locks under the prefix
// for it: keep the prefix narrow.
func WatchState() WatchOption { return func(w *watchConfig) { w.state = true } }

// WatchFrom resumes a watch after position (an Event's Position): every
// later event is delivered exactly once, in order, or a reset says some
// were lost. A position of another cluster (one saved before the cluster
// was restored from a backup, say) gets a reset too.
func WatchFrom(position string) WatchOption { return func(w *watchConfig) { w.from = position } }

// watchIdle is how long a watch stream may stay silent before the client
// takes the node for dead and reconnects: the server sends a keepalive
// every 15 s.
const watchIdle = 40 * time.Second

var watchBackoff = retry.Backoff{Base: 50 * time.Millisecond, Cap: 2 * time.Second}

// Watch streams the events of the locks whose names start with prefix, from
// now (or after WatchFrom's position), until ctx ends or the loop stops.
//
// Any node serves the watch from its applied log. When the stream breaks
// (a node dies, a connection drops) Watch reconnects by itself, to the next
// endpoint, and resumes after the last position it delivered: no event is
// lost, repeated or reordered. When events were lost all the same (the
// position is older than the node keeps, the node restored a snapshot, or
// this consumer fell behind), Watch yields an Event of kind EventReset with
// an error matching ErrWatchReset and goes on after the reset's Position:
// re-read the state then (ListLocks, Election.Leader). Any other error ends
// the iteration: ctx's error, ErrClosed, or an invalid position.
func (c *Client) Watch(ctx context.Context, prefix string, opts ...WatchOption) iter.Seq2[Event, error] {
	var wc watchConfig
	for _, o := range opts {
		o(&wc)
	}
	return func(yield func(Event, error) bool) {
		w := &watcher{c: c, prefix: prefix, cursor: wc.from, state: wc.state, yield: yield}
		err := w.run(ctx)
		if err != nil && !w.stopped {
			yield(Event{}, err)
		}
	}
}

type watcher struct {
	c       *Client
	prefix  string
	cursor  string
	state   bool
	yield   func(Event, error) bool
	stopped bool // yield returned false
}

func (w *watcher) run(ctx context.Context) error {
	r := retry.New(ctx, watchBackoff)
	defer func() { r.Stop() }()
	for r.Next() {
		if w.c.isClosed() {
			return ErrClosed
		}
		got, err := w.stream(ctx, w.c.eps.At(r.Attempt()))
		if errors.Is(err, ErrClusterMismatch) {
			// Another cluster's node (a wrong endpoint, or a cluster
			// restored from a backup): its positions mean nothing here.
			r.Fail(err)
			continue
		}
		if w.stopped {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("watch %q: %w", w.prefix, ctx.Err())
		}
		switch connect.CodeOf(err) {
		case connect.CodeInvalidArgument:
			return fmt.Errorf("watch %q: %w: %w", w.prefix, ErrInvalidArgument, err)
		case connect.CodeUnauthenticated, connect.CodePermissionDenied:
			// Asking again changes nothing: the caller's credentials.
			return fmt.Errorf("watch %q: %w", w.prefix, mapError(err, ""))
		}
		if got {
			// It worked for a while: a fresh schedule, at once.
			r.Stop()
			r = retry.New(ctx, watchBackoff)
		}
		r.Fail(err)
	}
	return fmt.Errorf("watch %q: %w", w.prefix, r.Err())
}

// stream runs one stream on url until it breaks; got reports it received
// something.
func (w *watcher) stream(ctx context.Context, ep *wire.Node) (got bool, err error) {
	got, cluster, err := w.streamOnce(ctx, ep)
	if got || connect.CodeOf(err) != connect.CodeInvalidArgument {
		return got, err
	}
	// A server older than the cluster tag of positions refuses a tagged
	// one. When it belongs to the position's cluster (its answer says so),
	// the position without the tag means the same to it.
	bare, tag, ok := strings.Cut(w.cursor, "@")
	if !ok || tag == "" || !strings.HasPrefix(cluster, tag) {
		return got, err
	}
	w.c.logger.Debug("watch: the node takes no cluster tag in positions; resuming without it", "endpoint", ep.URL)
	w.cursor = bare
	got, _, err = w.streamOnce(ctx, ep)
	return got, err
}

// streamOnce is stream's one attempt; cluster is the node's answer's
// cluster id.
func (w *watcher) streamOnce(ctx context.Context, ep *wire.Node) (got bool, cluster string, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(watchIdle, cancel)
	defer idle.Stop()
	wc := lockdv1connect.NewWatchServiceClient(w.c.h1, ep.URL, w.c.clientOptions()...)
	st, err := wc.Watch(ctx, connect.NewRequest(&lockdv1.WatchRequest{Prefix: w.prefix, From: w.cursor, State: w.state}))
	if err != nil {
		return false, "", err
	}
	defer st.Close()
	defer func() { cluster = st.ResponseHeader().Get(endpoint.ClusterIDHeader) }()
	checked := false
	for st.Receive() {
		if !checked {
			checked = true
			if err := w.c.eps.CheckCluster(ep, st.ResponseHeader().Get(endpoint.ClusterIDHeader)); err != nil {
				return false, "", err
			}
		}
		idle.Reset(watchIdle)
		got = true
		m := st.Msg()
		if m.Kind == lockdv1.EventKind_EVENT_KIND_UNSPECIFIED {
			if m.Position != "" {
				w.cursor = m.Position // a keepalive: where the stream is
			}
			continue
		}
		switch {
		case w.state && (m.Kind == lockdv1.EventKind_EVENT_KIND_HELD || m.Kind == lockdv1.EventKind_EVENT_KIND_RESET):
			// A state dump (after the start or a reset) is whole only at
			// its SYNCED: the cursor stays before it, so a stream broken
			// midway starts the dump again instead of resuming after a
			// part of it.
		default:
			w.cursor = m.Position
		}
		ev := Event{Position: m.Position, Kind: EventKind(m.Kind), Name: m.Name, Session: m.Session, Owner: m.Owner,
			Token: m.Token, Shared: m.Mode == lockdv1.Mode_MODE_SHARED, Limit: m.Limit, Value: m.Value, EntryEnd: m.EntryEnd}
		var everr error
		if ev.Kind == EventReset {
			everr = fmt.Errorf("watch %q: %w (continue after %s)", w.prefix, ErrWatchReset, ev.Position)
		}
		if !w.yield(ev, everr) {
			w.stopped = true
			return got, "", nil
		}
	}
	err = st.Err()
	if err == nil {
		err = errors.New("watch stream ended")
	}
	return got, "", err
}

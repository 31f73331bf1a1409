package main

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockd-dev/lockd/internal/loadgen"
)

// zkDriver runs the workloads on ZooKeeper with go-zookeeper's lock
// recipe: an ephemeral sequential node under the lock's path; a waiter
// watches the node just before its own. A ZooKeeper session is a
// connection, so each session dials its own.
type zkDriver struct {
	dialCounter
	servers []string
}

// System names ZooKeeper in the report.
func (d *zkDriver) System() string { return "zookeeper" }

// ErrorKind names err for the report.
func (d *zkDriver) ErrorKind(err error) string { return errorKind(err) }

// NewClient returns a client; the connection is its session's.
func (d *zkDriver) NewClient(context.Context) (loadgen.Client, error) { return &zkClient{d: d}, nil }

type zkClient struct {
	d        *zkDriver
	sessions []*zkSession
}

// noLog keeps go-zookeeper's connection chatter out of the report.
type noLog struct{}

func (noLog) Printf(string, ...any) {}

// NewSession connects with a session timeout of ttl and waits until the
// server has granted the session.
func (c *zkClient) NewSession(ctx context.Context, ttl time.Duration) (loadgen.Session, error) {
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		dctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return c.d.dial(dctx, network, addr)
	}
	conn, events, err := zk.Connect(c.d.servers, ttl, zk.WithDialer(dial), zk.WithLogger(noLog{}))
	if err != nil {
		return nil, err
	}
	s := &zkSession{conn: conn, done: make(chan struct{}), ready: make(chan struct{})}
	go s.watch(events)
	select {
	case <-s.ready:
		c.sessions = append(c.sessions, s)
		return s, nil
	case <-s.done:
		conn.Close()
		return nil, errors.New("zookeeper session expired while connecting")
	case <-ctx.Done():
		conn.Close()
		return nil, ctx.Err()
	}
}

// Close closes the sessions (each owns its connection). A client's
// sessions are opened by one worker, so the list needs no lock.
func (c *zkClient) Close(ctx context.Context) error {
	for _, s := range c.sessions {
		_ = s.Close(ctx)
	}
	return nil
}

type zkSession struct {
	once  sync.Once
	conn  *zk.Conn
	ready chan struct{} // closed once the session is granted
	done  chan struct{} // closed when the session expires
}

// watch follows the connection's events until the connection is closed
// (the channel must be drained).
func (s *zkSession) watch(events <-chan zk.Event) {
	readyOnce, doneOnce := false, false
	for ev := range events {
		switch {
		case ev.State == zk.StateHasSession && !readyOnce:
			readyOnce = true
			close(s.ready)
		case ev.State == zk.StateExpired && !doneOnce:
			doneOnce = true
			close(s.done)
		}
	}
}

// NewMutex returns the recipe's lock on /name.
func (s *zkSession) NewMutex(name string) loadgen.Mutex {
	return zkMutex{zk.NewLock(s.conn, "/"+name, zk.WorldACL(zk.PermAll))}
}

// Done is closed when the session expires.
func (s *zkSession) Done() <-chan struct{} { return s.done }

// Close closes the session and its connection.
func (s *zkSession) Close(context.Context) error { s.once.Do(s.conn.Close); return nil }

// zkMutex adapts zk.Lock, whose calls take no context: a Lock queued when
// the run ends waits for its turn (every holder releases at once, so the
// queue drains quickly), and a call is bounded by the session timeout
// rather than the op timeout.
type zkMutex struct{ l *zk.Lock }

// Lock takes the lock.
func (m zkMutex) Lock(context.Context) error { return m.l.Lock() }

// Unlock releases it.
func (m zkMutex) Unlock(context.Context) error { return m.l.Unlock() }

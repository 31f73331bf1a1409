package main

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/lockd-dev/lockd"
)

// dialCounter counts the connections a driver's clients dial, the way
// `lockd bench` counts its own.
type dialCounter struct{ n atomic.Int64 }

// ConnsOpened returns the connections dialled so far.
func (c *dialCounter) ConnsOpened() int64 { return c.n.Load() }

func (c *dialCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.n.Add(1)
	d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return d.DialContext(ctx, network, addr)
}

// errorKind names an error for the report. redislock returns lockd's
// sentinels; etcd and ZooKeeper errors beyond timeouts are "other", with
// the first message of each kind in the report.
func errorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, lockd.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, lockd.ErrLeaseLost):
		return "lease-lost"
	case errors.Is(err, lockd.ErrNotHeld):
		return "not-held"
	}
	return "other"
}

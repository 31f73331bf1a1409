package main

import (
	"context"
	"net"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/lockd-dev/lockd/internal/loadgen"
)

// etcdDriver runs the workloads on etcd with the client's own recipe:
// a concurrency.Session (a lease kept alive over a gRPC stream) and
// concurrency.Mutex (a key under the lock's prefix with the lease; a
// waiter watches the key created just before its own).
type etcdDriver struct {
	dialCounter
	endpoints []string
}

// System names etcd in the report.
func (d *etcdDriver) System() string { return "etcd" }

// ErrorKind names err for the report.
func (d *etcdDriver) ErrorKind(err error) string { return errorKind(err) }

// NewClient opens an etcd client (one gRPC connection of its own).
func (d *etcdDriver) NewClient(ctx context.Context) (loadgen.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   d.endpoints,
		DialTimeout: 10 * time.Second,
		Context:     context.WithoutCancel(ctx),
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.dial(ctx, "tcp", addr)
		})},
	})
	if err != nil {
		return nil, err
	}
	return &etcdClient{cli: cli}, nil
}

type etcdClient struct {
	cli      *clientv3.Client
	sessions []*etcdSession
}

// NewSession grants a lease of ttl (whole seconds, at least 1) and keeps
// it alive until Close.
func (c *etcdClient) NewSession(ctx context.Context, ttl time.Duration) (loadgen.Session, error) {
	// The session's context bounds its keepalives for its whole life, so
	// it cannot be ctx, which only bounds the creation.
	life, cancel := context.WithCancel(context.Background())
	secs := max(1, int(ttl.Round(time.Second).Seconds()))
	type result struct {
		s   *concurrency.Session
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := concurrency.NewSession(c.cli, concurrency.WithTTL(secs), concurrency.WithContext(life))
		ch <- result{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			cancel()
			return nil, r.err
		}
		s := &etcdSession{s: r.s, cancel: cancel}
		c.sessions = append(c.sessions, s)
		return s, nil
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
}

// Close revokes the sessions' leases and closes the client. A client's
// sessions are opened by one worker, so the list needs no lock.
func (c *etcdClient) Close(ctx context.Context) error {
	for _, s := range c.sessions {
		_ = s.Close(ctx)
	}
	return c.cli.Close()
}

type etcdSession struct {
	s      *concurrency.Session
	cancel context.CancelFunc
	once   sync.Once
}

// NewMutex returns the recipe's mutex on the key prefix /name.
func (s *etcdSession) NewMutex(name string) loadgen.Mutex {
	return concurrency.NewMutex(s.s, "/"+name)
}

// Done is closed when the lease is lost.
func (s *etcdSession) Done() <-chan struct{} { return s.s.Done() }

// Close revokes the lease.
func (s *etcdSession) Close(context.Context) error {
	var err error
	s.once.Do(func() {
		err = s.s.Close()
		s.cancel()
	})
	return err
}

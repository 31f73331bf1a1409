package locktest_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
	"github.com/lockd-dev/lockd/locktest"
	"github.com/lockd-dev/lockd/redislock"
	"github.com/lockd-dev/lockd/redislock/redistest"
)

// TestConformance runs the one suite against every backend, table-driven
// over their constructors. Each backend declares what it lacks.
func TestConformance(t *testing.T) {
	for _, b := range []struct {
		name  string
		setup func(t *testing.T) func(t *testing.T) lockd.Backend
		lacks []locktest.Capability
	}{
		{"lockd", openLockd, nil},
		{"redis", openRedis, []locktest.Capability{locktest.RWMutexes}},
		{"redlock", openRedlock, []locktest.Capability{locktest.Tokens, locktest.Semaphores, locktest.RWMutexes}},
	} {
		t.Run(b.name, func(t *testing.T) {
			locktest.Run(t, locktest.Target{Open: b.setup(t), Lacks: b.lacks})
		})
	}
}

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openLockd starts an in-process lockd server; each Open is a new session.
func openLockd(t *testing.T) func(t *testing.T) lockd.Backend {
	srv := lockdtest.New(t)
	c, err := lockd.New(lockd.WithStream(lockdtest.Stream()), lockd.WithEndpoints(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	t.Cleanup(func() { checkStream(t, srv.URL()) })
	return func(t *testing.T) lockd.Backend {
		s, err := c.NewSession(ctx(t), lockd.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s.Backend()
	}
}

// openRedis starts a redis-server; each Open is a new Client.
func openRedis(t *testing.T) func(t *testing.T) lockd.Backend {
	srv := redistest.New(t)
	return func(t *testing.T) lockd.Backend {
		c, err := redislock.New(ctx(t), srv.Client(t), redislock.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c.Backend()
	}
}

// openRedlock starts three redis-servers; each Open is a new Redlock.
func openRedlock(t *testing.T) func(t *testing.T) lockd.Backend {
	srvs := []*redistest.Server{redistest.New(t), redistest.New(t), redistest.New(t)}
	return func(t *testing.T) lockd.Backend {
		var nodes []redis.UniversalClient
		for _, s := range srvs {
			nodes = append(nodes, s.Client(t))
		}
		r, err := redislock.NewRedlock(ctx(t), nodes, redislock.WithTTL(5*time.Second), redislock.WithRequestTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close(context.Background()) })
		return r.Backend()
	}
}

// checkStream checks that the suite's calls went over the session stream
// (the client's default), or unary with LOCKD_STREAM=off.
func checkStream(t *testing.T, url string) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Error(err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
		return
	}
	none := strings.Contains(string(b), "lockd_api_stream_frames_total{kind=\"acquire\"} 0\n")
	if off := os.Getenv("LOCKD_STREAM") == "off"; none != off {
		t.Errorf("acquires went over the stream: %v, with LOCKD_STREAM=%q", !none, os.Getenv("LOCKD_STREAM"))
	}
}

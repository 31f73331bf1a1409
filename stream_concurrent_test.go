package lockd_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/lockd-dev/lockd"
	"github.com/lockd-dev/lockd/lockdtest"
)

// Many goroutines sharing one client (one stream) lock and unlock at
// once, so that frames are sent in batches and answers written together:
// every call is answered with its own result, over the one stream.
func TestStreamConcurrentCallsShareOneStream(t *testing.T) {
	srv := lockdtest.New(t)
	c := newClient(t, srv, lockd.WithStream(true))
	const workers, rounds = 24, 10
	sessions := make([]*lockd.Session, workers)
	for i := range sessions {
		sessions[i] = newSession(t, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i, s := range sessions {
		wg.Go(func() {
			m := s.NewMutex(fmt.Sprintf("shared-stream/%d", i))
			var last uint64
			for range rounds {
				if err := m.Lock(t.Context()); err != nil {
					errs <- fmt.Errorf("worker %d lock: %w", i, err)
					return
				}
				if m.Token() <= last {
					errs <- fmt.Errorf("worker %d: token %d after %d", i, m.Token(), last)
					return
				}
				last = m.Token()
				if err := m.Unlock(t.Context()); err != nil {
					errs <- fmt.Errorf("worker %d unlock: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := frames(t, srv.URL(), "acquire"); n < workers*rounds {
		t.Errorf("%v acquire frames, want >= %d", n, workers*rounds)
	}
	if n := metric(t, srv.URL(), "lockd_api_streams_open"); n != 1 {
		t.Errorf("%v streams open, want 1", n)
	}
}

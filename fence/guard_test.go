package fence_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/lockd-dev/lockd/fence"
)

// TestGuardModel: any sequence of Admit, Do and Highest on a few keys
// behaves like a map of the highest token accepted per key.
func TestGuardModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var g fence.Guard
		model := map[string]uint64{}
		keys := []string{"a", "b", "c"}
		n := rapid.IntRange(1, 100).Draw(t, "ops")
		for range n {
			key := rapid.SampledFrom(keys).Draw(t, "key")
			token := rapid.Uint64Range(0, 30).Draw(t, "token")
			switch op := rapid.IntRange(0, 3).Draw(t, "op"); op {
			case 0, 1:
				ran := false
				var err error
				if op == 0 {
					err = g.Admit(key, token)
				} else {
					err = g.Do(key, token, func() error { ran = true; return nil })
				}
				switch want := model[key]; {
				case token == 0:
					if !errors.Is(err, fence.ErrNoToken) || ran {
						t.Fatalf("token 0 for %q: %v (ran %v), want ErrNoToken", key, err, ran)
					}
				case token < want:
					var se *fence.StaleError
					if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) || se.Highest != want || se.Token != token || ran {
						t.Fatalf("token %d for %q after %d: %v (ran %v), want a StaleError", token, key, want, err, ran)
					}
				default:
					if err != nil || op == 1 && !ran {
						t.Fatalf("token %d for %q after %d: %v (ran %v), want admitted", token, key, want, err, ran)
					}
					model[key] = token
				}
			case 2:
				if got := g.Highest(key); got != model[key] {
					t.Fatalf("Highest(%q) = %d, want %d", key, got, model[key])
				}
			case 3:
				g.Forget(key)
				delete(model, key)
			}
		}
	})
}

// TestGuardConcurrent: holders racing with tokens in any order through Do
// act in non-decreasing token order; every refused token is below one that
// acted; the highest token always acts.
func TestGuardConcurrent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var g fence.Guard
		tokens := rapid.SliceOfN(rapid.Uint64Range(1, 1000), 1, 40).Draw(t, "tokens")
		keys := rapid.IntRange(1, 3).Draw(t, "keys")
		var mu sync.Mutex
		acted := map[string][]uint64{}
		refused := map[string][]uint64{}
		var wg sync.WaitGroup
		for i, tok := range tokens {
			key := fmt.Sprint(i % keys)
			wg.Go(func() {
				err := g.Do(key, tok, func() error {
					mu.Lock()
					acted[key] = append(acted[key], tok)
					mu.Unlock()
					return nil
				})
				if err != nil {
					if !errors.Is(err, fence.ErrStale) {
						t.Errorf("token %d: %v", tok, err)
					}
					mu.Lock()
					refused[key] = append(refused[key], tok)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		for i := range keys {
			key := fmt.Sprint(i)
			a := acted[key]
			if !slices.IsSorted(a) {
				t.Fatalf("key %s: acted in order %v, want non-decreasing", key, a)
			}
			var all []uint64
			for j, tok := range tokens {
				if j%keys == i {
					all = append(all, tok)
				}
			}
			if len(all) == 0 {
				continue
			}
			top := slices.Max(all)
			if len(a) == 0 || a[len(a)-1] != top || g.Highest(key) != top {
				t.Fatalf("key %s: acted %v, highest %d; want the top token %d to act", key, a, g.Highest(key), top)
			}
			for _, r := range refused[key] {
				if r >= top {
					t.Fatalf("key %s: token %d refused, but nothing above it acted (%v)", key, r, a)
				}
			}
			if len(a)+len(refused[key]) != len(all) {
				t.Fatalf("key %s: %d acted + %d refused, want %d", key, len(a), len(refused[key]), len(all))
			}
		}
	})
}

func ExampleGuard() {
	var g fence.Guard
	// Holder A got token 7 and was paused; B got 8 and wrote.
	fmt.Println(g.Do("stock/laptop", 8, func() error { return nil }))
	// A resumes and tries to write with 7.
	err := g.Do("stock/laptop", 7, func() error { panic("never runs") })
	fmt.Println(errors.Is(err, fence.ErrStale), err)
	// Output:
	// <nil>
	// true fence: stale token 7 for "stock/laptop": 8 was accepted already
}

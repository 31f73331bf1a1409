//go:build race

package lockd_test

// raceOn: the race detector is on, and allocation counts mean nothing
// (sync.Pool drops items at random, instrumentation allocates).
const raceOn = true

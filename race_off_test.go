//go:build !race

package lockd_test

// raceOn: the race detector is off.
const raceOn = false

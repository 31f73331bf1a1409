// Package fleettest holds the fleet test of `lockd cron`: four real
// processes for three minutes of wall time. It is a package of its own so
// that `go test ./...` runs it beside the other packages instead of after
// cmd/lockd's own tests.
package fleettest

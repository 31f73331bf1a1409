// Package deploy holds lockd's Prometheus alert rules (prometheus/) and
// Grafana dashboard (grafana/), and the test that keeps them honest: every
// rule parses with Prometheus's own rule parser, and every metric a rule or
// a panel names exists on the /metrics of a lockd built from this tree.
// It is a module of its own so that the Prometheus dependency stays out of
// lockd's module; run its test with (cd deploy && go test ./...).
package deploy

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// checkPprofAddr refuses a --pprof-listen address that is not loopback.
func checkPprofAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--pprof-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--pprof-listen %q: want a loopback address (the profiler has no auth)", addr)
	}
	return nil
}

// startPprof serves Go's profiler (net/http/pprof) on addr, a loopback
// address of its own: the profiles are unauthenticated and say much about
// the process, so they never share the API listener, which may face the
// network and carry auth. guard is the node's Host/Origin check (a page
// rebinding its name to 127.0.0.1 must not read the profiles either). It
// returns a func that stops the listener.
func startPprof(addr string, guard func(http.Handler) http.Handler, logger *slog.Logger) (func(), error) {
	if err := checkPprofAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: guard(mux), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("pprof listener", "err", err)
		}
	}()
	logger.Info("pprof listening", "addr", ln.Addr().String())
	return func() { _ = hs.Close() }, nil
}

package node

import (
	"context"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter routes hashicorp/raft's hclog output into slog.
type hclogAdapter struct {
	l    *slog.Logger
	name string
	args []any
}

// NewHclog returns an hclog.Logger (what hashicorp/raft logs to) that writes to l, named name.
func NewHclog(l *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{l: l.With("component", name), name: name}
}

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Log implements hclog.Logger.
func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	h.l.Log(context.Background(), slogLevel(level), msg, args...)
}

// Trace implements hclog.Logger.
func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }

// Debug implements hclog.Logger.
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }

// Info implements hclog.Logger.
func (h *hclogAdapter) Info(msg string, args ...any) { h.Log(hclog.Info, msg, args...) }

// Warn implements hclog.Logger.
func (h *hclogAdapter) Warn(msg string, args ...any) { h.Log(hclog.Warn, msg, args...) }

// Error implements hclog.Logger.
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

// IsTrace implements hclog.Logger.
func (h *hclogAdapter) IsTrace() bool { return false }

// IsDebug implements hclog.Logger.
func (h *hclogAdapter) IsDebug() bool {
	return h.l.Enabled(context.Background(), slog.LevelDebug)
}

// IsInfo implements hclog.Logger.
func (h *hclogAdapter) IsInfo() bool { return h.l.Enabled(context.Background(), slog.LevelInfo) }

// IsWarn implements hclog.Logger.
func (h *hclogAdapter) IsWarn() bool { return true }

// IsError implements hclog.Logger.
func (h *hclogAdapter) IsError() bool { return true }

// ImpliedArgs implements hclog.Logger.
func (h *hclogAdapter) ImpliedArgs() []any { return h.args }

// Name implements hclog.Logger.
func (h *hclogAdapter) Name() string { return h.name }

// SetLevel implements hclog.Logger.
func (h *hclogAdapter) SetLevel(hclog.Level) {}

// GetLevel implements hclog.Logger.
func (h *hclogAdapter) GetLevel() hclog.Level {
	if h.IsDebug() {
		return hclog.Debug
	}
	return hclog.Info
}

// With implements hclog.Logger.
func (h *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{l: h.l.With(args...), name: h.name, args: append(append([]any{}, h.args...), args...)}
}

// Named implements hclog.Logger.
func (h *hclogAdapter) Named(name string) hclog.Logger {
	return &hclogAdapter{l: h.l.With("sub", name), name: h.name + "." + name, args: h.args}
}

// ResetNamed implements hclog.Logger.
func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: h.l, name: name, args: h.args}
}

// StandardLogger implements hclog.Logger.
func (h *hclogAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(h.l.Handler(), slog.LevelInfo)
}

// StandardWriter implements hclog.Logger.
func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return h.StandardLogger(nil).Writer()
}

package server

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

func newHclog(l *slog.Logger, name string) hclog.Logger {
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

func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	h.l.Log(context.Background(), slogLevel(level), msg, args...)
}
func (h *hclogAdapter) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }
func (h *hclogAdapter) IsTrace() bool                 { return false }
func (h *hclogAdapter) IsDebug() bool {
	return h.l.Enabled(context.Background(), slog.LevelDebug)
}
func (h *hclogAdapter) IsInfo() bool         { return h.l.Enabled(context.Background(), slog.LevelInfo) }
func (h *hclogAdapter) IsWarn() bool         { return true }
func (h *hclogAdapter) IsError() bool        { return true }
func (h *hclogAdapter) ImpliedArgs() []any   { return h.args }
func (h *hclogAdapter) Name() string         { return h.name }
func (h *hclogAdapter) SetLevel(hclog.Level) {}
func (h *hclogAdapter) GetLevel() hclog.Level {
	if h.IsDebug() {
		return hclog.Debug
	}
	return hclog.Info
}
func (h *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{l: h.l.With(args...), name: h.name, args: append(append([]any{}, h.args...), args...)}
}
func (h *hclogAdapter) Named(name string) hclog.Logger {
	return &hclogAdapter{l: h.l.With("sub", name), name: h.name + "." + name, args: h.args}
}
func (h *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{l: h.l, name: name, args: h.args}
}
func (h *hclogAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(h.l.Handler(), slog.LevelInfo)
}
func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return h.StandardLogger(nil).Writer()
}

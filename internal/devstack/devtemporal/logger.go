package devtemporal

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// minServerLogLevel is the lowest level of Temporal's own log records that is
// forwarded to the caller's logger. Temporal is very chatty at debug and info
// level (every service start, shard movement, namespace refresh, ...), which
// is noise for a developer running `engine dev`.
const minServerLogLevel = slog.LevelWarn

// fatalError is the panic value raised by serverLogger.Fatal and
// serverLogger.Panic while the server is starting. Start recovers it and
// turns it into an ordinary error (for example when a gRPC listener cannot be
// created).
type fatalError struct {
	msg   string
	attrs []slog.Attr
}

// Error implements error.
func (e *fatalError) Error() string {
	var b strings.Builder
	b.WriteString(e.msg)
	for _, a := range e.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	return b.String()
}

// serverLogger adapts a *slog.Logger to Temporal's log.Logger interface.
//
// Records below minServerLogLevel are dropped. Fatal and Panic are logged at
// error level; while starting is set they also panic with a *fatalError (the
// Temporal code calling them does not expect them to return, and Start
// recovers the panic). After startup they only log, like the Temporal CLI dev
// server does, so that a background failure inside Temporal cannot exit the
// host process.
type serverLogger struct {
	log      *slog.Logger
	starting *atomic.Bool
}

var (
	_ log.Logger     = serverLogger{}
	_ log.WithLogger = serverLogger{}
)

// newServerLogger returns a Temporal logger writing to l. The returned
// logger panics on Fatal/Panic for as long as starting is true.
func newServerLogger(l *slog.Logger, starting *atomic.Bool) serverLogger {
	return serverLogger{log: l.With("component", "temporal"), starting: starting}
}

// Debug implements log.Logger; debug records are dropped.
func (s serverLogger) Debug(msg string, tags ...tag.Tag) { s.emit(slog.LevelDebug, msg, tags) }

// Info implements log.Logger; info records are dropped.
func (s serverLogger) Info(msg string, tags ...tag.Tag) { s.emit(slog.LevelInfo, msg, tags) }

// Warn implements log.Logger.
func (s serverLogger) Warn(msg string, tags ...tag.Tag) { s.emit(slog.LevelWarn, msg, tags) }

// Error implements log.Logger.
func (s serverLogger) Error(msg string, tags ...tag.Tag) { s.emit(slog.LevelError, msg, tags) }

// DPanic implements log.Logger; it logs at error level and never panics.
func (s serverLogger) DPanic(msg string, tags ...tag.Tag) { s.emit(slog.LevelError, msg, tags) }

// Panic implements log.Logger; see serverLogger for when it panics.
func (s serverLogger) Panic(msg string, tags ...tag.Tag) { s.fatal(msg, tags) }

// Fatal implements log.Logger; see serverLogger for when it panics. It never
// exits the process.
func (s serverLogger) Fatal(msg string, tags ...tag.Tag) { s.fatal(msg, tags) }

// With implements log.WithLogger.
func (s serverLogger) With(tags ...tag.Tag) log.Logger {
	if len(tags) == 0 {
		return s
	}
	args := make([]any, len(tags))
	for i, a := range tagsToAttrs(tags) {
		args[i] = a
	}
	return serverLogger{log: s.log.With(args...), starting: s.starting}
}

func (s serverLogger) fatal(msg string, tags []tag.Tag) {
	attrs := tagsToAttrs(tags)
	s.log.LogAttrs(context.Background(), slog.LevelError, msg, attrs...)
	if s.starting.Load() {
		panic(&fatalError{msg: msg, attrs: attrs})
	}
}

func (s serverLogger) emit(level slog.Level, msg string, tags []tag.Tag) {
	if level < minServerLogLevel || !s.log.Enabled(context.Background(), level) {
		return
	}
	s.log.LogAttrs(context.Background(), level, msg, tagsToAttrs(tags)...)
}

func tagsToAttrs(tags []tag.Tag) []slog.Attr {
	attrs := make([]slog.Attr, len(tags))
	for i, t := range tags {
		attrs[i] = slog.Any(t.Key(), t.Value())
	}
	return attrs
}

package devtemporal

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
)

// minServerLogLevel is the lowest level of Temporal's own log records that is
// forwarded to the caller's logger. Temporal is very chatty at debug and info
// level (every service start, shard movement, namespace refresh, ...), which
// is noise for a developer running `engine dev`.
const minServerLogLevel = slog.LevelWarn

// maxBufferedRecords bounds the records kept while the server starts.
const maxBufferedRecords = 200

// logPhase says what a serverLogger does with a record.
type logPhase int

const (
	// phaseStarting buffers warn+ records: a healthy start logs a few
	// transient warnings and errors (Nexus HTTP port not set, shard status
	// unknown, ...) that are only worth showing if the start fails.
	phaseStarting logPhase = iota
	// phaseRunning forwards warn+ records to the caller's logger.
	phaseRunning
	// phaseStopping drops everything: shutting down makes every service log
	// canceled contexts, refused connections and closed task queues.
	phaseStopping
)

// bufferedRecord is a record held back during phaseStarting.
type bufferedRecord struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	attrs []slog.Attr
}

// logState is shared by a serverLogger and all loggers derived from it with
// With.
type logState struct {
	mu           sync.Mutex
	phase        logPhase
	panicOnFatal bool
	buffer       []bufferedRecord
}

// setPhase switches to phase. Leaving phaseStarting replays the buffered
// records if flush is set and discards them otherwise.
func (st *logState) setPhase(phase logPhase, flush bool) {
	st.mu.Lock()
	buffered := st.buffer
	st.buffer = nil
	st.phase = phase
	st.mu.Unlock()
	if !flush {
		return
	}
	for _, r := range buffered {
		r.log.LogAttrs(context.Background(), r.level, r.msg, r.attrs...)
	}
}

// setPanicOnFatal controls whether Fatal and Panic panic with a *fatalError.
func (st *logState) setPanicOnFatal(v bool) {
	st.mu.Lock()
	st.panicOnFatal = v
	st.mu.Unlock()
}

// fatalError is the panic value raised by serverLogger.Fatal and
// serverLogger.Panic while the server is being created and started. Start
// recovers it and turns it into an ordinary error (for example when a gRPC
// listener cannot be created).
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
// Debug and info records are dropped; warn+ records are handled according to
// the shared logState phase. Fatal and Panic are error records; while
// panicOnFatal is set they also panic with a *fatalError (the Temporal code
// calling them does not expect them to return, and Start recovers the panic).
// Otherwise they only log, like the Temporal CLI dev server does, so that a
// background failure inside Temporal cannot exit the host process.
type serverLogger struct {
	log   *slog.Logger
	state *logState
}

var (
	_ log.Logger     = serverLogger{}
	_ log.WithLogger = serverLogger{}
)

// newServerLogger returns a Temporal logger writing to l, in phaseStarting
// with panicOnFatal set.
func newServerLogger(l *slog.Logger) serverLogger {
	return serverLogger{
		log:   l.With("component", "temporal"),
		state: &logState{phase: phaseStarting, panicOnFatal: true},
	}
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
	return serverLogger{log: s.log.With(args...), state: s.state}
}

func (s serverLogger) fatal(msg string, tags []tag.Tag) {
	attrs := tagsToAttrs(tags)
	s.record(slog.LevelError, msg, attrs)
	s.state.mu.Lock()
	panicking := s.state.panicOnFatal
	s.state.mu.Unlock()
	if panicking {
		panic(&fatalError{msg: msg, attrs: attrs})
	}
}

func (s serverLogger) emit(level slog.Level, msg string, tags []tag.Tag) {
	if level < minServerLogLevel || !s.log.Enabled(context.Background(), level) {
		return
	}
	s.record(level, msg, tagsToAttrs(tags))
}

func (s serverLogger) record(level slog.Level, msg string, attrs []slog.Attr) {
	st := s.state
	st.mu.Lock()
	switch st.phase {
	case phaseStarting:
		if len(st.buffer) == maxBufferedRecords {
			st.buffer = st.buffer[1:]
		}
		st.buffer = append(st.buffer, bufferedRecord{log: s.log, level: level, msg: msg, attrs: attrs})
		st.mu.Unlock()
		return
	case phaseStopping:
		st.mu.Unlock()
		return
	}
	st.mu.Unlock()
	s.log.LogAttrs(context.Background(), level, msg, attrs...)
}

func tagsToAttrs(tags []tag.Tag) []slog.Attr {
	attrs := make([]slog.Attr, len(tags))
	for i, t := range tags {
		attrs[i] = slog.Any(t.Key(), t.Value())
	}
	return attrs
}

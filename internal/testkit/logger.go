package testkit

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Logger returns a slog logger that writes through t.Log (shown only for
// failing tests or with -v), at warn level and above unless REVEILLE_TEST_LOG
// is set to "debug" or "info".
func Logger(t testing.TB) *slog.Logger {
	return slog.New(&tHandler{t: t, mu: &sync.Mutex{}, level: testLevel()})
}

type tHandler struct {
	t     testing.TB
	mu    *sync.Mutex
	attrs []slog.Attr
	level slog.Level
}

func (h *tHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *tHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	for _, a := range h.attrs {
		b.WriteString(" " + a.String())
	}
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	h.mu.Lock()
	defer h.mu.Unlock()
	defer func() { _ = recover() }() // logging after the test ended must not panic
	h.t.Log(b.String())
	return nil
}

func (h *tHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr{}, h.attrs...), attrs...)
	return &c
}

func (h *tHandler) WithGroup(string) slog.Handler { return h }

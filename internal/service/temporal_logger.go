package service

import (
	"fmt"
	"log/slog"
	"strings"

	"go.temporal.io/sdk/log"

	"github.com/reveille/reveille/workflows/reference"
)

// TemporalLogger routes the Temporal SDK's logs into l, at the levels that
// matter here: its info is debug, and the errors that are expected (a
// failed poll while Temporal is down, a refused spend) are not errors.
func TemporalLogger(l *slog.Logger) log.Logger { return temporalLogger{l} }

type temporalLogger struct{ l *slog.Logger }

func (t temporalLogger) Debug(msg string, kv ...any) { t.l.Debug(msg, kv...) }
func (t temporalLogger) Info(msg string, kv ...any)  { t.l.Debug(msg, kv...) }
func (t temporalLogger) Warn(msg string, kv ...any)  { t.l.Warn(msg, kv...) }
func (t temporalLogger) Error(msg string, kv ...any) {
	// The SDK logs every failed poll while Temporal is down, and a refused
	// spend is an expected activity outcome: neither is an error here.
	if strings.Contains(msg, "poll") {
		t.l.Warn(msg, kv...)
		return
	}
	if strings.Contains(fmt.Sprint(kv...), reference.RefusedErrorType) {
		t.l.Info(msg, kv...)
		return
	}
	t.l.Error(msg, kv...)
}

//go:build !faults

package main

import (
	"log/slog"

	"github.com/reveille/reveille/internal/service"
)

// applyFaultHooks does nothing: crash points exist only in a binary built
// with `-tags faults` (faulthook.go), for the fault suite.
func applyFaultHooks(*service.Config, *slog.Logger) {}

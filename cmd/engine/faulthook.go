//go:build faults

package main

import (
	"context"
	"log/slog"
	"os"
	"syscall"

	"github.com/google/uuid"

	"github.com/reveille/reveille/internal/service"
)

// crashAtVar names the crash point of a fault-suite build
// (internal/faults). Only a binary built with `-tags faults` reads it:
// this file is not compiled into any other, so a production engine has no
// way to be told to kill itself. It is read here, not in config.go, for
// the same reason.
const crashAtVar = "REVEILLE_FAULT_CRASH_AT"

// afterSpendCommit kills the process between a wake-up's mandate decision
// (committed) and the enqueue of its work: the reconciler must enqueue
// the funded intent.
const afterSpendCommit = "after-spend-commit"

// applyFaultHooks arms the crash point crashAtVar names, if any.
func applyFaultHooks(c *service.Config, logger *slog.Logger) {
	switch at := os.Getenv(crashAtVar); at {
	case "":
	case afterSpendCommit:
		logger.Warn("fault build: this process kills itself after the first wake-up's spend commits", "var", crashAtVar)
		c.Wakeup.BeforeEnqueue = func(_ context.Context, id uuid.UUID) error {
			logger.Warn("fault build: killing this process after the spend of a wake-up", "wakeup_id", id.String())
			// SIGKILL, as a crash: no deferred cleanup, no drain.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	default:
		logger.Error("fault build: unknown crash point; none armed", "var", crashAtVar, "value", at)
	}
}

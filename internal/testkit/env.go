package testkit

import (
	"log/slog"
	"os"
)

func testLevel() slog.Level {
	switch os.Getenv("REVEILLE_TEST_LOG") {
	case "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

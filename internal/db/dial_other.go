//go:build !linux

package db

import (
	"syscall"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not offered:
// keepalive alone bounds a silent peer there.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }

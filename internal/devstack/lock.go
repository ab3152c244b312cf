package devstack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// LockFileName is the file in a data directory that its user holds an
// exclusive flock on.
const LockFileName = "reveille.lock"

// ErrDataDirInUse is returned (as a *DataDirInUseError) when another process
// holds a data directory's lock.
var ErrDataDirInUse = errors.New("data directory in use")

// DataDirInUseError names the data directory and the process holding it.
type DataDirInUseError struct {
	Dir    string // as the caller named it
	PID    int    // 0 when the holder had not written its pid yet
	Holder string // what the holder said it is, e.g. "engine dev"
}

func (e *DataDirInUseError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("data directory %s is in use by another process", e.Dir)
	}
	if e.Holder == "" {
		return fmt.Sprintf("data directory %s is in use by pid %d", e.Dir, e.PID)
	}
	return fmt.Sprintf("data directory %s is in use by pid %d (%s)", e.Dir, e.PID, e.Holder)
}

func (e *DataDirInUseError) Unwrap() error { return ErrDataDirInUse }

// DataDirLock is a held data directory lock.
type DataDirLock struct {
	f *os.File
}

// LockDataDir takes an exclusive lock on dir (created if missing) for this
// process, or fails at once with a *DataDirInUseError when another process
// holds it. holder says what the process is ("engine dev"); it and the pid
// are written into the lock file for that error. The lock is a flock, which
// the kernel drops when the process dies however it dies, so a killed run
// never leaves a stale lock; the file is opened close-on-exec, so postgres
// and initdb children do not inherit (and outlive us holding) it. flock
// belongs to the open file description: a second LockDataDir of the same
// directory in the same process fails too.
func LockDataDir(dir, holder string) (*DataDirLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, LockFileName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open data dir lock: %w", err)
	}
	if err := flockNow(f); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid, who := parseLockOwner(f)
			return nil, &DataDirInUseError{Dir: dir, PID: pid, Holder: who}
		}
		return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
	}
	// Written only while the lock is held: a lock file with content names
	// a process that held the lock (see LockAbandonedDataDir).
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+" "+holder+"\n"), 0)
	}
	return &DataDirLock{f: f}, nil
}

// LockAbandonedDataDir takes dir's lock if a process held it and is gone.
// ok is false (and nothing is held) when the directory has no lock file,
// when its lock file is empty (its creator may be about to take the lock),
// or when a live process holds it. Use it only on directories that are
// never reused, such as test processes' temporary ones: a fresh holder's
// lock file is empty until it holds the lock, but a reused one still names
// the previous holder.
func LockAbandonedDataDir(dir string) (lock *DataDirLock, previous string, ok bool) {
	path := filepath.Join(dir, LockFileName)
	b, err := os.ReadFile(path)
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return nil, "", false
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, "", false
	}
	if err := flockNow(f); err != nil {
		f.Close()
		return nil, "", false
	}
	return &DataDirLock{f: f}, strings.TrimSpace(string(b)), true
}

// Release drops the lock. Releasing twice is fine.
func (l *DataDirLock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the last descriptor drops the flock
	l.f = nil
	return err
}

func flockNow(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func parseLockOwner(f *os.File) (pid int, holder string) {
	b := make([]byte, 512)
	n, _ := f.ReadAt(b, 0)
	pidText, holder, _ := strings.Cut(strings.TrimSpace(string(b[:n])), " ")
	pid, _ = strconv.Atoi(pidText)
	return pid, holder
}

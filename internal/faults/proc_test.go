//go:build faults

package faults

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process of the suite: a devstack or a replica. Its
// stdout and stderr go to a log file; stdout lines are also offered to
// waitLine (the devstack prints its addresses there once ready).
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}

	mu    sync.Mutex
	lines []string
	seen  chan struct{} // closed and replaced at each new stdout line
}

// startProc starts bin with args and env (added to this process's).
// pdeath is the signal the child gets when this process dies, however it
// dies (Linux): a killed suite leaves nothing running.
func startProc(name, logPath string, env []string, pdeath syscall.Signal, bin string, args ...string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, logPath: logPath, done: make(chan struct{}), seen: make(chan struct{})}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	// Its own process group: a Ctrl-C on the suite reaches the suite only,
	// which stops its children itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: pdeath}
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p.cmd = cmd
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			p.mu.Lock()
			p.lines = append(p.lines, line)
			close(p.seen)
			p.seen = make(chan struct{})
			p.mu.Unlock()
		}
		_, _ = io.Copy(logFile, stdout)
		_ = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// waitLine waits for a stdout line starting with prefix and returns the
// rest of it.
func (p *proc) waitLine(prefix string, limit time.Duration) (string, error) {
	deadline := time.After(limit)
	for {
		p.mu.Lock()
		for _, l := range p.lines {
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				p.mu.Unlock()
				return rest, nil
			}
		}
		seen := p.seen
		p.mu.Unlock()
		select {
		case <-seen:
		case <-p.done:
			return "", fmt.Errorf("%s exited before printing %s (exit %d; log %s):\n%s", p.name, prefix, p.exitCode(), p.logPath, p.logTail(20))
		case <-deadline:
			return "", fmt.Errorf("%s printed no %s within %s (log %s):\n%s", p.name, prefix, limit, p.logPath, p.logTail(20))
		}
	}
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitCode is the process's exit status: -1 while it runs or when a
// signal ended it.
func (p *proc) exitCode() int {
	if !p.exited() {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// signal sends sig to the process.
func (p *proc) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// wait waits up to limit for the process to exit.
func (p *proc) wait(limit time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(limit):
		return errors.New(p.name + " did not exit within " + limit.String())
	}
}

// kill SIGKILLs the process and waits for it.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// stop SIGTERMs the process and waits up to limit, then kills it.
func (p *proc) stop(limit time.Duration) error {
	p.signal(syscall.SIGTERM)
	if err := p.wait(limit); err != nil {
		p.kill()
		return err
	}
	return nil
}

// logTail is the last n lines of the process's log.
func (p *proc) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

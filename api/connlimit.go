package api

import "syscall"

// defaultMaxConnections is half the process's open-file limit (at least
// 256; no bound when the limit cannot be read): the other half stays for
// the database pool, Temporal, the work's outbound requests and files.
func defaultMaxConnections() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur == 0 {
		return -1
	}
	return int(max(min(lim.Cur/2, 1<<30), 256))
}

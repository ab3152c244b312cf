//go:build !linux

package devstack

import "syscall"

// dieWithParent is a no-op where there is no parent-death signal; a dead
// test process's cluster is then only reaped by the next one.
func dieWithParent(*syscall.SysProcAttr) {}

package devstack

import "syscall"

// dieWithParent has the kernel send the postmaster SIGQUIT (immediate
// shutdown) when the thread that started it exits; startServer keeps that
// thread alive for as long as the server runs, so in effect when this
// process dies.
func dieWithParent(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGQUIT }

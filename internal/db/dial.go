package db

import (
	"context"
	"net"

	"github.com/jackc/pgx/v5"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The network's bounds on a database connection (Dial).
const (
	// KeepAliveIdle, KeepAliveInterval and KeepAliveCount: an idle
	// connection is probed after KeepAliveIdle, then every
	// KeepAliveInterval, and ended after KeepAliveCount probes go
	// unanswered — 35 s for a peer gone from the network while this side
	// waits for an answer (a statement the server runs, a LISTEN), where
	// Go's defaults (15 s, 15 s, 9) took two and a half minutes.
	KeepAliveIdle     = 15 * time.Second
	KeepAliveInterval = 5 * time.Second
	KeepAliveCount    = 4
	// UserTimeout ends a connection whose sent data goes unacknowledged
	// that long (Linux's TCP_USER_TIMEOUT): a statement sent on a
	// connection the network blackholed (a NAT that forgot it, a failover
	// that left the old primary's address unanswered) fails after it,
	// whatever its context, where the kernel retransmitted for about 15
	// minutes. Longer than any retransmission a healthy network needs.
	UserTimeout = 30 * time.Second
)

// IdleInTransaction is how long the server lets a session of the service
// sit in an open transaction waiting for its next statement before it
// ends the session (idle_in_transaction_session_timeout, one of
// ServerSessionParams). The network bounds end a session whose peer went
// silent; they cannot end one whose peer's kernel still answers for a
// process that stopped mid-transaction — a replica frozen (SIGSTOP, a VM
// paused, a swap storm) in a spend kept the mandate's row locked, and
// every spend and wake-up of that mandate waiting, until it thawed. The
// service's transactions send their statements back to back (a gap is
// milliseconds); those that wait in Go between statements — a pool's
// onComplete hooks, a leader's fenced writes — set their own, longer
// bound. Half the 30 s a spend batch or a wake-up group gives its
// transaction: the spends waiting on a frozen session's row are still
// decided.
const IdleInTransaction = 15 * time.Second

// Dial opens a database connection bounded by the network limits above:
// pgx's DialFunc for every pool of the service (a Unix socket is dialled
// as it is). Statements that wait on a healthy server take as long as the
// server takes: the bounds end only a connection whose peer stopped
// answering at the TCP level. (A server process that hangs while its
// host answers for it is caught only by a statement's own deadline.)
func Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount},
		Control: func(network, _ string, c syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil
			}
			return setUserTimeout(c, UserTimeout)
		},
	}
	return d.DialContext(ctx, network, addr)
}

// ServerSessionParams are the same bounds for the server's end of each
// session (run-time parameters sent at connect): a client gone from the
// network (its node lost, a NAT that forgot the connection: its close
// never arrives) leaves its session to the server's TCP, which kept it —
// its open transaction, the row locks and advisory locks it held — for
// about two hours by default (tcp_keepalives_idle is the system's). With
// them the server ends it within about 35 s of silence; and a session
// left idle in a transaction after IdleInTransaction.
func ServerSessionParams() map[string]string {
	return map[string]string{
		"tcp_keepalives_idle":                 strconv.Itoa(int(KeepAliveIdle.Seconds())),
		"tcp_keepalives_interval":             strconv.Itoa(int(KeepAliveInterval.Seconds())),
		"tcp_keepalives_count":                strconv.Itoa(KeepAliveCount),
		"tcp_user_timeout":                    strconv.FormatInt(UserTimeout.Milliseconds(), 10),
		"idle_in_transaction_session_timeout": strconv.FormatInt(IdleInTransaction.Milliseconds(), 10),
	}
}

// BoundNetwork dials cc's connections with Dial and sends the server
// ServerSessionParams at connect, except those cc's URL sets itself, as a
// parameter or in its options (parameters in the URL win): both ends of a connection whose peer
// stopped answering at the TCP level (a NAT that forgot it, a failover, a
// node gone) give up within about 35 s, whatever waits on it — the
// kernels' defaults kept it minutes on this side and hours on the
// server's, with the locks its session held; and the server ends a
// session left idle in a transaction for IdleInTransaction.
func BoundNetwork(cc *pgx.ConnConfig) {
	cc.DialFunc = Dial
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	for k, v := range ServerSessionParams() {
		if !hasParam(cc.RuntimeParams, k) && !setInOptions(cc.RuntimeParams["options"], k) {
			cc.RuntimeParams[k] = v
		}
	}
}

// hasParam reports whether params sets the run-time parameter name, in any
// case (as the server reads names: both spellings sent, either could win).
func hasParam(params map[string]string, name string) bool {
	for k := range params {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// setInOptions reports whether options — the startup parameter options
// (the URL's options=, or PGOPTIONS): switches for the server's session —
// sets the run-time parameter name, as -c name=value, -cname=value or
// --name=value (a name's dashes read as underscores, in any case). The
// server applies a startup parameter of its own after options, so sending
// one would override the URL's choice.
func setInOptions(options, name string) bool {
	f := splitOptions(options)
	for i := 0; i < len(f); i++ {
		var setting string
		switch {
		case f[i] == "-c" && i+1 < len(f):
			i++
			setting = f[i]
		case strings.HasPrefix(f[i], "-c"), strings.HasPrefix(f[i], "--"):
			setting = f[i][2:]
		default:
			continue
		}
		if k, _, ok := strings.Cut(setting, "="); ok && strings.EqualFold(strings.ReplaceAll(k, "-", "_"), name) {
			return true
		}
	}
	return false
}

// splitOptions splits options into its switches as the server does
// (pg_split_opts): at ASCII whitespace, a backslash taking the next
// character as it is.
func splitOptions(options string) []string {
	var (
		out     []string
		b       strings.Builder
		in, esc bool
	)
	for _, r := range options {
		switch {
		case esc:
			b.WriteRune(r)
			esc = false
		case r == '\\':
			esc, in = true, true
		case strings.ContainsRune(" \t\n\v\f\r", r): // (C's isspace, as the server's)
			if in {
				out = append(out, b.String())
				b.Reset()
				in = false
			}
		default:
			b.WriteRune(r)
			in = true
		}
	}
	if in {
		out = append(out, b.String())
	}
	return out
}

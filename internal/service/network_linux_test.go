package service_test

import (
	"context"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/reveille/reveille/internal/service"
)

// The service's database connections end within about 35 s of the peer
// going silent at the TCP level, on both sides: this side probes an idle
// connection (keepalive) and gives up on data the network never
// acknowledges (TCP_USER_TIMEOUT), and the server's session does the same
// — else a client gone from the network left its session, and the locks it
// held, to the server's TCP for about two hours. The server also ends a
// session left idle in a transaction for 15 s (a replica frozen in the
// middle of one). Parameters the URL sets win.
func TestTheServicesConnectionsEndWithinSecondsOfASilentPeer(t *testing.T) {
	for _, tc := range []struct {
		name, query string
		server      map[string]string
	}{
		{name: "defaults", server: map[string]string{
			"tcp_keepalives_idle": "15", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "4", "tcp_user_timeout": "30000",
			"idle_in_transaction_session_timeout": "15000"}},
		{name: "the URL's own", query: "tcp_keepalives_idle=60&tcp_user_timeout=90000&idle_in_transaction_session_timeout=0", server: map[string]string{
			"tcp_keepalives_idle": "60", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "4", "tcp_user_timeout": "90000",
			"idle_in_transaction_session_timeout": "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cfg := testConfig(t)
			if tc.query != "" {
				cfg.DatabaseURL += "&" + tc.query
			}
			var pc *pgxpool.Config
			cfg.ConfigureDB = func(c *pgxpool.Config) { pc = c.Copy() }
			svc, err := service.New(ctx, cfg)
			require.NoError(t, err)
			svc.Close()
			require.NotNil(t, pc, "the service configured its pool")
			db, err := pgxpool.NewWithConfig(ctx, pc)
			require.NoError(t, err)
			defer db.Close()
			c, err := db.Acquire(ctx)
			require.NoError(t, err)
			defer c.Release()

			tcp, ok := c.Conn().PgConn().Conn().(*net.TCPConn)
			require.True(t, ok, "a TCP connection: %T", c.Conn().PgConn().Conn())
			raw, err := tcp.SyscallConn()
			require.NoError(t, err)
			got := map[string]int{}
			require.NoError(t, raw.Control(func(fd uintptr) {
				for name, opt := range map[string][2]int{
					"SO_KEEPALIVE":     {unix.SOL_SOCKET, unix.SO_KEEPALIVE},
					"TCP_KEEPIDLE":     {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
					"TCP_KEEPINTVL":    {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL},
					"TCP_KEEPCNT":      {unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
					"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
				} {
					v, err := unix.GetsockoptInt(int(fd), opt[0], opt[1])
					require.NoError(t, err, name)
					got[name] = v
				}
			}))
			require.Equal(t, map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 15, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 4,
				"TCP_USER_TIMEOUT": 30000}, got, "this side's socket")

			server := map[string]string{}
			for name := range tc.server {
				var v string
				require.NoError(t, c.QueryRow(ctx, "SELECT setting FROM pg_settings WHERE name = $1", name).Scan(&v))
				server[name] = v
			}
			require.Equal(t, tc.server, server, "the server's end of the session")
		})
	}
}

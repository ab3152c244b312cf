package workpool

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/reveille/reveille/internal/listen"
)

// listener holds this replica's LISTEN connection and routes notifications
// to the loops and the executor. It listens before anything looks at the
// tables, so work committed later always announces itself; a connection
// silent for a heartbeat interval is pinged (an idle loop sets no timer, so
// a peer that vanished without a word would leave enqueued work unstarted
// for good); after a lost connection it reconnects and wakes everything,
// since notifications sent meanwhile are gone.
type listener struct {
	m    *Manager
	loop listen.Loop
	conn atomic.Pointer[pgx.Conn] // the current connection
}

func newListener(ctx context.Context, m *Manager) (*listener, error) {
	l := &listener{m: m}
	l.loop = listen.Loop{DB: m.db, Channel: notifyChannel, Name: "workpool listener", Logger: m.logger,
		PingEvery: m.cfg.HeartbeatInterval, PingTimeout: max(m.cfg.HeartbeatInterval, 5*time.Second),
		Notify: l.dispatch, Reconnected: m.kickAll, Connected: func(c *pgx.Conn) { l.conn.Store(c) }}
	if _, err := l.loop.Connect(ctx); err != nil {
		return nil, fmt.Errorf("workpool listener: %w", err)
	}
	return l, nil
}

func (l *listener) run(ctx context.Context) { l.loop.Run(ctx, l.conn.Load()) }

// dispatch routes one payload (see notifyChannel). This replica's own
// notifications were already acted on directly.
func (l *listener) dispatch(payload string) {
	body, origin, _ := strings.Cut(payload, "@")
	if origin != "" && origin == l.m.origin {
		return
	}
	kind, rest, ok := strings.Cut(body, ":")
	if !ok {
		return
	}
	switch kind {
	case "h":
		l.m.sawPeer(origin)
	case "e":
		l.m.kickLoop(rest, kickEnqueue)
	case "k":
		l.m.kickLoop(rest, kickWork)
	case "s":
		l.m.exec.kick()
	case "x":
		var ids []uuid.UUID
		for _, s := range strings.Split(rest, ",") {
			if id, err := uuid.Parse(s); err == nil {
				ids = append(ids, id)
			}
		}
		l.m.exec.cancelJobs(ids)
	}
}

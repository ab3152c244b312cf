package workpool

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// listener holds this replica's LISTEN connection and routes notifications
// to the loops and the executor. It listens before anything looks at the
// tables, so work committed later always announces itself; after a lost
// connection it reconnects and wakes everything, since notifications sent
// meanwhile are gone.
type listener struct {
	m    *Manager
	conn *pgx.Conn
}

func newListener(ctx context.Context, m *Manager) (*listener, error) {
	l := &listener{m: m}
	if err := l.connect(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *listener) connect(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, l.m.db.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("workpool listener: connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return fmt.Errorf("workpool listener: listen: %w", err)
	}
	l.conn = conn
	return nil
}

func (l *listener) run(ctx context.Context) {
	defer func() { _ = l.conn.Close(context.WithoutCancel(ctx)) }()
	backoff := newBackoff(100*time.Millisecond, 5*time.Second)
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if err == nil {
			l.dispatch(n.Payload)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		l.m.logger.Warn("workpool listener lost its connection; reconnecting", "error", err.Error())
		_ = l.conn.Close(context.WithoutCancel(ctx))
		for {
			if !sleepCtx(ctx, backoff.next()) {
				return
			}
			if err := l.connect(ctx); err == nil {
				break
			} else if ctx.Err() == nil {
				l.m.logger.Warn("workpool listener reconnect failed", "error", err.Error())
			}
		}
		backoff.reset()
		l.m.kickAll()
	}
}

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

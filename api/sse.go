package api

import (
	"errors"
	"net/http"
	"os"
	"time"

	"github.com/labstack/echo/v4"
)

// sseSend writes p (when not empty) to a Server-Sent Events response and
// flushes it, with a write deadline of WriteTimeout of its own: a stream
// lasts as long as its client keeps reading, while one that stops reading
// is cut off instead of holding the handler, its stream slot and the
// connection until the client goes. An error means the stream is over (the
// client left, or did not read in time).
func (s *Server) sseSend(c echo.Context, p []byte) error {
	res := c.Response()
	// The writer under echo's: echo's Flush drops the error that tells a
	// stalled client from a live one.
	rc := http.NewResponseController(res.Writer)
	// Each slice of p gets the write timeout of its own: a batch of events
	// (megabytes when a tail catches up) is not one write that a client
	// reading steadily, but slower than the batch's size per timeout, can
	// never finish. An error here is a writer without deadlines (a test
	// recorder): it has none to move.
	var err error
	for len(p) > 0 && err == nil {
		n := min(len(p), sseWriteSlice)
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		_, err = res.Write(p[:n])
		p = p[n:]
	}
	if err == nil {
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		err = rc.Flush()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.logger.Info("SSE client stopped reading; stream closed", "route", c.Path(), "org_id", PrincipalFrom(c).OrgID,
			"write_timeout", s.cfg.WriteTimeout.String())
	}
	return err
}

// sseWriteSlice is the most an SSE write sends under one write deadline.
const sseWriteSlice = 64 << 10

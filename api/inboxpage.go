package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/web"
)

// inboxPageRoutes serve the approvals inbox page (web.Inbox) without auth: the
// page holds no data; everything it shows it fetches from /v1 with the
// token the user gives it.
func (s *Server) inboxPageRoutes() {
	// "/inbox/" is the page too (a typed or pasted address often ends so);
	// rewritten, not routed, so it is one documented route.
	s.echo.Pre(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if c.Request().URL.Path == "/inbox/" {
				c.Request().URL.Path = "/inbox"
			}
			return next(c)
		}
	})
	getHead := []string{http.MethodGet, http.MethodHead}
	s.echo.Match(getHead, "/inbox", func(c echo.Context) error { return s.serveInboxPage(c, "") })
	s.echo.Match(getHead, "/inbox/:asset", func(c echo.Context) error { return s.serveInboxPage(c, c.Param("asset")) })
}

func (s *Server) serveInboxPage(c echo.Context, name string) error {
	if s.inboxHTML.Serve(c.Response(), c.Request(), name) {
		return nil
	}
	web.SetHeaders(c.Response().Header())
	return NewProblem(http.StatusNotFound, "not-found", "the inbox has no file "+name)
}

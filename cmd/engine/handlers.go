package main

import (
	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

// registerHandlers registers the built-in work handlers.
func registerHandlers(pool *workpool.Manager, s settings) {
	httpwork.Register(pool, httpwork.Config{AllowedHosts: s.HTTPAllowed})
}

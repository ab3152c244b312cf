package main

import (
	"github.com/reveille/reveille/workpool"
)

// registerHandlers registers the built-in work handlers.
func registerHandlers(pool *workpool.Manager, s settings) {
	_ = pool
	_ = s
}

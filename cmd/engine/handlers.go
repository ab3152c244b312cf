package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/reveille/reveille/workpool"
	"github.com/reveille/reveille/workpool/httpwork"
)

// devHTTPAllowed is the allow-list of `engine dev` and the demo: any port
// on this machine, as their targets listen on random ports.
var devHTTPAllowed = []string{"localhost:*", "127.0.0.1:*"}

// registerHandlers registers the built-in work handlers.
func registerHandlers(pool *workpool.Manager, s settings, reg prometheus.Registerer) error {
	return httpwork.Register(pool, httpwork.Config{AllowedHosts: s.HTTPAllowed, AllowedNets: s.HTTPNets, Registry: reg})
}

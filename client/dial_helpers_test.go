package client_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// trackedDial dials real connections, each wrapped by wrap, and lists
// those dialled so far (a test arms them to fail or stall their writes).
func trackedDial[C net.Conn](wrap func(net.Conn) C) (dial func(ctx context.Context, network, addr string) (net.Conn, error), dialled func() []C) {
	var mu sync.Mutex
	var conns []C
	dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := wrap(conn)
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		return c, nil
	}
	dialled = func() []C {
		mu.Lock()
		defer mu.Unlock()
		return append([]C(nil), conns...)
	}
	return dial, dialled
}

// startH2C starts srv speaking HTTP/2 over cleartext (prior knowledge).
func startH2C(srv *httptest.Server) {
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
}

// h2cTransport speaks HTTP/2 over cleartext, dialling with dial.
func h2cTransport(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	tr := &http.Transport{Protocols: new(http.Protocols), DialContext: dial}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

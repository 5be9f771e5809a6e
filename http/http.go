package rsockhttp

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/rsockio/rsock/rsock"
)

// ListenAndServe listens on srv.Addr (":http" when empty) with rsock and serves srv's
// handler on it. Like [http.Server.ListenAndServe] it always returns a non-nil error, and
// [http.ErrServerClosed] after srv.Shutdown or srv.Close.
//
// To learn the address of a server listening on port 0, set srv.BaseContext: net/http
// calls it with the Listener.
func ListenAndServe(srv *http.Server, cfg *rsock.Config) error {
	addr := srv.Addr
	if addr == "" {
		addr = ":http"
	}
	ln, err := rsock.Listen("tcp", addr, cfg)
	if err != nil {
		return fmt.Errorf("rsockhttp: %w", err)
	}
	return srv.Serve(ln)
}

// NewTransport returns a clone of [http.DefaultTransport] whose connections are dialed
// through rsock with cfg (nil for defaults). Proxies are disabled: a proxy would carry
// the bytes over its own TCP connection and defeat the point.
//
// Call CloseIdleConnections on it when done: like any http.Transport it keeps idle
// connections open for reuse.
func NewTransport(cfg *rsock.Config) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	d := &rsock.Dialer{Config: cfg}
	t.DialContext = d.DialContext
	t.Proxy = nil
	return t
}

// NewClient returns an [http.Client] using [NewTransport](cfg).
func NewClient(cfg *rsock.Config) *http.Client {
	return &http.Client{Transport: NewTransport(cfg)}
}

// connKey is the context key under which ConnContext stores a request's connection.
type connKey struct{}

// ConnContext is meant for [http.Server.ConnContext]: it stores each connection in the
// context of the requests that arrive on it, where [ConnTransport] finds it.
//
//	srv := &http.Server{Handler: h, ConnContext: rsockhttp.ConnContext}
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// ConnTransport returns the transport that carried r: "rdma", "rdma+tls", "tcp" or "quic", as
// [rsock.Conn.Transport] reports it. It returns "" if the server's ConnContext is not
// [ConnContext], or if the connection is not an rsock one.
func ConnTransport(r *http.Request) string {
	c, _ := r.Context().Value(connKey{}).(interface{ Transport() string })
	if c == nil {
		return ""
	}
	return c.Transport()
}

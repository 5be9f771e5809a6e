package rsockhttp

import (
	"fmt"
	"net/http"

	"github.com/rsockio/rsock/rsock"
)

// ListenAndServe listens on srv.Addr (":http" when empty) with rsock and serves srv's
// handler on it. Like [http.Server.ListenAndServe] it always returns a non-nil error, and
// [http.ErrServerClosed] after srv.Shutdown or srv.Close.
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

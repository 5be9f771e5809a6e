package rsockhttp

import (
	"net"
	"net/http"

	"github.com/rsockio/rsock/rsock"
)

// maxUnwrap bounds how many wrappers Conn looks through, so that a wrapper that
// returns itself cannot hold it in a loop.
const maxUnwrap = 8

// Conn returns the [*rsock.Conn] that carried r, from which a handler learns more than
// [ConnTransport] says: its fallback reason ([rsock.Conn.FallbackReason]), its
// addresses. It needs the server's ConnContext to be [ConnContext], and returns nil
// without it, or if the connection is not an rsock one.
//
// A connection wrapped by something that exposes what it wraps with a NetConn method,
// as [crypto/tls.Conn] does (a server that serves TLS on an rsock Listener), is looked
// through.
//
// Calling its Read, Write or Close from a handler interferes with net/http's own use
// of the connection, as on any connection net/http serves; Transport, FallbackReason
// and the addresses are safe to call.
func Conn(r *http.Request) *rsock.Conn {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	for range maxUnwrap {
		switch v := c.(type) {
		case *rsock.Conn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

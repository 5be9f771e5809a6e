package rsock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rsockio/rsock/fallback"
)

// This file keeps the promise of an encrypted bootstrap: a connection set up over QUIC
// (TLS 1.3) and upgraded to RDMA moves its bytes in plaintext only when both sides set
// Config.AllowPlaintextRDMA. Otherwise the RDMA stream carries TLS 1.3, run with the
// Config's TLSConfig: the client verifies the server's certificate exactly as its QUIC
// handshake did, the server presents the same certificates.
//
// The two sides agree on it over the fresh RDMA stream, before any application byte:
// each writes one mode byte, modePlain if it allows plaintext, modeTLS if not, and reads
// the peer's. Plaintext needs two modePlain bytes; anything else means TLS, and a byte
// that is neither fails the connection. A peer on the fabric that rewrites a mode byte
// can thus force TLS (which then authenticates the server), never plaintext against a
// side that requires TLS.
//
// A connection bootstrapped over TCP has no encryption to keep and no mode exchange:
// both sides know the bootstrap transport, so they agree without one.

// Mode bytes of the exchange that opens an RDMA stream over a QUIC bootstrap.
const (
	modePlain = 'P'
	modeTLS   = 'T'
)

// errBadMode: the peer's mode byte is not one rsock sends, so this side cannot tell
// whether the peer encrypts. It fails the connection: rsock never guesses plaintext.
var errBadMode = errors.New("bad security mode byte")

// secureClient runs the client's side of the mode exchange, and of TLS when it is
// needed, on c, a Conn just upgraded to RDMA over the bootstrap transport of cfg. ctx
// bounds it.
func secureClient(ctx context.Context, c *Conn, cfg *Config) error {
	if cfg.Fallback != FallbackQUIC {
		return nil
	}
	return secure(ctx, c, cfg, true)
}

// secureAccepted is secureClient's counterpart on a Listener: c arrived on transport and
// its hello exchange is done. Close of the Listener (l.ctx) and the handshake timeout
// bound it.
func (l *Listener) secureAccepted(c *Conn, transport string) error {
	if c.transport != TransportRDMA || transport != TransportQUIC {
		return nil
	}
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.HandshakeTimeout)
	defer cancel()
	return secure(ctx, c, l.cfg, false)
}

// secure exchanges mode bytes on c's RDMA stream and starts TLS over it unless both
// sides allow plaintext. ctx bounds it: its deadline becomes the stream's, and its end
// wakes the stream's blocked calls.
func secure(ctx context.Context, c *Conn, cfg *Config, client bool) error {
	raw := c.s
	if deadline, ok := ctx.Deadline(); ok {
		raw.SetDeadline(deadline)
	}
	fired := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		raw.SetDeadline(aLongTimeAgo)
		close(fired)
	})
	s, err := negotiate(ctx, c, cfg, client)
	if !stopAfter() {
		<-fired // the stream's deadline is in the past: the connection is unusable
		if err == nil {
			err = fmt.Errorf("rdma security: %w", ctx.Err())
		}
	}
	if err != nil {
		return err
	}
	raw.SetDeadline(time.Time{})
	if s != nil {
		c.s = s
		c.transport = TransportRDMATLS
	}
	return nil
}

// negotiate runs the mode exchange and, unless both sides allow plaintext, the TLS
// handshake. It returns the TLS stream, or nil for plaintext.
func negotiate(ctx context.Context, c *Conn, cfg *Config, client bool) (*tlsStream, error) {
	raw := c.s
	mine := byte(modeTLS)
	if cfg.AllowPlaintextRDMA {
		mine = modePlain
	}
	if _, err := raw.Write([]byte{mine}); err != nil {
		return nil, fmt.Errorf("rdma security: send mode: %w", ctxErr(ctx, err))
	}
	var peer [1]byte
	if _, err := io.ReadFull(raw, peer[:]); err != nil {
		return nil, fmt.Errorf("rdma security: read peer's mode: %w", ctxErr(ctx, err))
	}
	if peer[0] != modePlain && peer[0] != modeTLS {
		return nil, fmt.Errorf("rdma security: %w %#x", errBadMode, peer[0])
	}
	if mine == modePlain && peer[0] == modePlain {
		return nil, nil
	}
	nc := &streamConn{stream: raw, local: c.local, remote: c.remote}
	var tc *tls.Conn
	if client {
		tc = tls.Client(nc, dataTLSConfig(cfg.TLSConfig, false))
	} else {
		tc = tls.Server(nc, dataTLSConfig(cfg.TLSConfig, true))
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("rdma security: tls handshake: %w", ctxErr(ctx, err))
	}
	return &tlsStream{Conn: tc}, nil
}

// ctxErr adds ctx's error to err, a failed read or write, when ctx ended: the deadline
// set from ctx, or the past deadline set when ctx was cancelled, caused it.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", err, cerr)
	}
	return err
}

// dataTLSConfig returns the TLS configuration of the RDMA data path: the caller's (for
// QUIC) with TLS 1.3 at least, rsock's application protocol when it names none, and no
// session resumption (the QUIC handshake's tickets carry QUIC state and must not be
// offered here).
func dataTLSConfig(base *tls.Config, server bool) *tls.Config {
	c := base.Clone()
	if c.MinVersion < tls.VersionTLS13 {
		c.MinVersion = tls.VersionTLS13
	}
	if len(c.NextProtos) == 0 {
		c.NextProtos = []string{fallback.NextProto}
	}
	if server {
		c.SessionTicketsDisabled = true
	} else {
		c.ClientSessionCache = nil
	}
	return c
}

// withServerName returns cfg, or a copy whose TLSConfig names the server to verify,
// host, when it named none: the QUIC handshake and the TLS handshake over RDMA then
// check the same name.
func withServerName(cfg *Config, host string) *Config {
	if cfg.TLSConfig == nil || cfg.TLSConfig.ServerName != "" || host == "" {
		return cfg
	}
	r := *cfg
	r.TLSConfig = cfg.TLSConfig.Clone()
	r.TLSConfig.ServerName = host
	return &r
}

// streamConn presents an RDMA stream as the net.Conn crypto/tls runs on.
type streamConn struct {
	stream
	local, remote net.Addr
}

func (s *streamConn) LocalAddr() net.Addr  { return s.local }
func (s *streamConn) RemoteAddr() net.Addr { return s.remote }

// tlsStream is a Conn's data path over TLS. CloseWrite sends TLS's close_notify, which
// the peer's Read returns as io.EOF; the RDMA stream underneath stays open for the
// peer's bytes until Close.
type tlsStream struct {
	*tls.Conn
	closeOnce sync.Once
	closeErr  error
}

// Close closes the TLS stream and the RDMA stream under it. As the RDMA stream's own
// Close, a second call waits for the first to finish (crypto/tls would return at once,
// before the RDMA resources are released), then returns an error matching
// net.ErrClosed.
func (s *tlsStream) Close() error {
	first := false
	s.closeOnce.Do(func() {
		first = true
		s.closeErr = s.Conn.Close()
	})
	if !first {
		return fmt.Errorf("rsock: close: %w", net.ErrClosed)
	}
	return s.closeErr
}

var _ stream = (*tlsStream)(nil)

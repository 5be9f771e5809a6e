package fallback

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
)

// NextProto is the TLS application protocol (ALPN) a QUIC connection negotiates when the
// caller's tls.Config names none.
const NextProto = "rsock"

// Defaults of [QUICOptions].
const (
	DefaultStreamTimeout = 10 * time.Second
	DefaultLinger        = 10 * time.Second
	DefaultMaxPending    = 128
)

// QUICOptions configure QUIC dialing and listening. The zero value of each field selects
// its default; TLSConfig is required.
type QUICOptions struct {
	// TLSConfig is the TLS configuration. A listener needs a certificate in it; a dialer
	// verifies the server against it. If it names no application protocol, [NextProto]
	// is used. It is cloned, never modified.
	TLSConfig *tls.Config
	// QUICConfig tunes quic-go; nil means quic-go's defaults. It is cloned, and its
	// stream limits are overridden: the dialing side may open one bidirectional stream,
	// and each side one unidirectional stream (used when closing).
	QUICConfig *quic.Config
	// KeepAlive is the period of keep-alive packets when QUICConfig sets none. Zero or
	// negative sends none, and an idle connection then ends after quic-go's idle timeout.
	KeepAlive time.Duration
	// StreamTimeout bounds how long a listener waits for an accepted connection's stream
	// (its first byte). Default DefaultStreamTimeout.
	StreamTimeout time.Duration
	// Linger bounds how long a closed connection waits for the peer to finish before the
	// QUIC connection is torn down regardless. Default DefaultLinger.
	Linger time.Duration
	// MaxPending bounds the connections a listener holds that are waiting for their
	// stream or for Accept. Default DefaultMaxPending.
	MaxPending int

	// LocalAddr is the address a dialer's UDP socket binds to; nil picks one, as
	// net.ListenUDP does. Listeners ignore it.
	LocalAddr *net.UDPAddr
	// Control, if not nil, is called with a dialer's UDP socket before it binds, as
	// [net.ListenConfig.Control] is. Listeners ignore it.
	Control func(network, address string, c syscall.RawConn) error
}

func (o *QUICOptions) withDefaults() (QUICOptions, error) {
	if o == nil || o.TLSConfig == nil {
		return QUICOptions{}, errors.New("QUIC needs a TLS configuration")
	}
	r := *o
	if r.StreamTimeout <= 0 {
		r.StreamTimeout = DefaultStreamTimeout
	}
	if r.Linger <= 0 {
		r.Linger = DefaultLinger
	}
	if r.MaxPending <= 0 {
		r.MaxPending = DefaultMaxPending
	}
	return r, nil
}

// tls returns the TLS configuration for one side; serverName is set on a dialer's copy
// when the caller left it empty.
func (o *QUICOptions) tls(serverName string) *tls.Config {
	c := o.TLSConfig.Clone()
	if len(c.NextProtos) == 0 {
		c.NextProtos = []string{NextProto}
	}
	if c.ServerName == "" {
		c.ServerName = serverName
	}
	return c
}

// quic returns quic-go's configuration for one side, with rsock's stream limits.
func (o *QUICOptions) quic(server bool) *quic.Config {
	c := &quic.Config{}
	if o.QUICConfig != nil {
		c = o.QUICConfig.Clone()
	}
	c.MaxIncomingUniStreams = 1 // the peer's "all arrived" signal, see QUICConn.Close
	c.MaxIncomingStreams = -1
	if server {
		c.MaxIncomingStreams = 1
	}
	if c.KeepAlivePeriod == 0 && o.KeepAlive > 0 {
		c.KeepAlivePeriod = o.KeepAlive
	}
	return c
}

// DialQUIC connects to address over QUIC and opens the connection's stream. network is
// a TCP or UDP network name (see the package documentation). The connection has its own
// UDP socket, closed when the connection ends.
//
// The listener sees the connection only once something is written to it; see
// [QUICConn].
func DialQUIC(ctx context.Context, network, address string, opts *QUICOptions) (*QUICConn, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("fallback: dial quic %s: %w", address, err)
	}
	udpNet, err := udpNetwork(network)
	if err != nil {
		return nil, err
	}
	host, raddr, err := resolveUDP(ctx, udpNet, address)
	if err != nil {
		return nil, fmt.Errorf("fallback: dial quic %s: %w", address, err)
	}
	var laddr string
	if o.LocalAddr != nil {
		laddr = o.LocalAddr.String()
	}
	lc := net.ListenConfig{Control: o.Control}
	pc, err := lc.ListenPacket(ctx, udpNet, laddr)
	if err != nil {
		return nil, fmt.Errorf("fallback: dial quic %s: %w", address, err)
	}
	tr := &sharedTransport{tr: &quic.Transport{Conn: pc}, pc: pc, refs: 1}
	qc, err := tr.tr.Dial(ctx, raddr, o.tls(host), o.quic(false))
	if err != nil {
		tr.release()
		return nil, fmt.Errorf("fallback: dial quic %s: %w", address, err)
	}
	context.AfterFunc(qc.Context(), tr.release)
	str, err := qc.OpenStream()
	if err != nil {
		qc.CloseWithError(codeAbort, "")
		return nil, fmt.Errorf("fallback: dial quic %s: open stream: %w", address, err)
	}
	return newQUICConn(qc, str, o.Linger), nil
}

// resolveUDP resolves address for network, honoring ctx, and returns its host part.
func resolveUDP(ctx context.Context, network, address string) (string, *net.UDPAddr, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return "", nil, err
	}
	p, err := net.DefaultResolver.LookupPort(ctx, network, port)
	if err != nil {
		return "", nil, err
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return host, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(p))), nil
	}
	ipNet := "ip"
	switch network {
	case "udp4":
		ipNet = "ip4"
	case "udp6":
		ipNet = "ip6"
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, ipNet, host)
	if err != nil {
		return "", nil, err
	}
	if len(ips) == 0 {
		return "", nil, fmt.Errorf("no address for %s", host)
	}
	return host, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ips[0].Unmap(), uint16(p))), nil
}

// sharedTransport is a UDP socket with its quic-go Transport, shared by a listener and
// the connections it accepted, or owned by one dialed connection. Each user holds a
// reference; the last release closes the transport and the socket.
type sharedTransport struct {
	tr *quic.Transport
	pc net.PacketConn

	mu   sync.Mutex
	refs int
}

// acquire takes a reference, unless the transport is already closed.
func (t *sharedTransport) acquire() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refs == 0 {
		return false
	}
	t.refs++
	return true
}

// release drops a reference and closes the transport with the last one.
func (t *sharedTransport) release() {
	t.mu.Lock()
	t.refs--
	last := t.refs == 0
	t.mu.Unlock()
	if last {
		t.tr.Close()
		t.pc.Close()
	}
}

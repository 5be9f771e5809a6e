package fallback

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"
)

// DialTCP connects to address over TCP. keepAlive is the keep-alive period as in
// [net.Dialer.KeepAlive]: zero selects the system default, negative disables it.
func DialTCP(ctx context.Context, network, address string, keepAlive time.Duration) (*net.TCPConn, error) {
	return DialTCPWith(ctx, &net.Dialer{KeepAlive: keepAlive}, network, address)
}

// DialTCPWith connects to address over TCP with d, whose fields (LocalAddr, Timeout,
// KeepAlive, Control...) apply as net.Dialer documents them.
func DialTCPWith(ctx context.Context, d *net.Dialer, network, address string) (*net.TCPConn, error) {
	if err := checkTCPNetwork(network); err != nil {
		return nil, err
	}
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// ListenTCP listens on address over TCP. Accepted connections get keep-alive with the
// period keepAlive, as in [net.ListenConfig.KeepAlive].
func ListenTCP(network, address string, keepAlive time.Duration) (*net.TCPListener, error) {
	if err := checkTCPNetwork(network); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{KeepAlive: keepAlive}
	ln, err := lc.Listen(context.Background(), network, address)
	if err != nil {
		return nil, err
	}
	return ln.(*net.TCPListener), nil
}

// dualListenAttempts bounds how many TCP ports ListenTCPAndQUIC tries when it picks the
// port itself and the UDP port of the same number is taken.
const dualListenAttempts = 16

// ListenTCPAndQUIC listens on address over TCP and over QUIC at the same port number.
// network is a TCP network name; QUIC listens on the matching UDP family. If the port
// is 0, the TCP listener picks a free port and UDP must get the same one; when it
// cannot, ListenTCPAndQUIC tries another port, a bounded number of times.
func ListenTCPAndQUIC(network, address string, keepAlive time.Duration, opts *QUICOptions) (*net.TCPListener, *QUICListener, error) {
	if err := checkTCPNetwork(network); err != nil {
		return nil, nil, err
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, nil, fmt.Errorf("fallback: listen %s %s: %w", network, address, err)
	}
	pickPort := port == "" || port == "0"
	for attempt := 1; ; attempt++ {
		tl, err := ListenTCP(network, address, keepAlive)
		if err != nil {
			return nil, nil, err
		}
		p := tl.Addr().(*net.TCPAddr).Port
		ql, err := ListenQUIC(network, net.JoinHostPort(host, strconv.Itoa(p)), opts)
		if err == nil {
			return tl, ql, nil
		}
		tl.Close()
		if !pickPort || attempt == dualListenAttempts || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, fmt.Errorf("fallback: listen %s %s: QUIC on port %d: %w", network, address, p, err)
		}
	}
}

// checkTCPNetwork rejects network names that are not TCP's.
func checkTCPNetwork(network string) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
		return nil
	}
	return fmt.Errorf("fallback: %w", net.UnknownNetworkError(network))
}

// udpNetwork maps a TCP or UDP network name to the UDP one of the same family.
func udpNetwork(network string) (string, error) {
	switch network {
	case "tcp", "udp":
		return "udp", nil
	case "tcp4", "udp4":
		return "udp4", nil
	case "tcp6", "udp6":
		return "udp6", nil
	}
	return "", fmt.Errorf("fallback: %w", net.UnknownNetworkError(network))
}

package fallback

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rsockio/rsock/internal/testcert"
)

// quicOptions returns listener and dialer options with the test certificate.
func quicOptions(t testing.TB) (server, client *QUICOptions) {
	t.Helper()
	st, ct, err := testcert.Configs()
	require.NoError(t, err)
	return &QUICOptions{TLSConfig: st}, &QUICOptions{TLSConfig: ct}
}

// quicPipe returns a dialed and an accepted QUICConn, connected. The dialer writes one
// byte first (the stream reaches the listener only with its first byte), which the
// accepting side consumes.
func quicPipe(t testing.TB, ln *QUICListener, copts *QUICOptions) (dialed, accepted *QUICConn) {
	t.Helper()
	c, err := DialQUIC(context.Background(), "udp", ln.Addr().String(), copts)
	require.NoError(t, err)
	_, err = c.Write([]byte{'!'})
	require.NoError(t, err)
	s, err := ln.AcceptQUIC()
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = io.ReadFull(s, b)
	require.NoError(t, err)
	return c, s
}

func TestQUICConnNettest(t *testing.T) {
	sopts, copts := quicOptions(t)
	ln, err := ListenQUIC("udp", "127.0.0.1:0", sopts)
	require.NoError(t, err)
	defer ln.Close()
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		d, a := quicPipe(t, ln, copts)
		return d, a, func() { d.Close(); a.Close() }, nil
	})
}

// TestQUICCloseDelivers checks that data written right before Close reaches the peer
// in full, in both directions, including when both sides close at once.
func TestQUICCloseDelivers(t *testing.T) {
	sopts, copts := quicOptions(t)
	ln, err := ListenQUIC("udp", "127.0.0.1:0", sopts)
	require.NoError(t, err)
	defer ln.Close()

	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	d, a := quicPipe(t, ln, copts)
	errs := make(chan error, 2)
	got := make(chan []byte, 2)
	for _, c := range []*QUICConn{d, a} {
		go func() {
			_, err := c.Write(payload)
			errs <- errors.Join(err, c.CloseWrite())
		}()
		go func() {
			b, err := io.ReadAll(c)
			errs <- err
			got <- b
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	for range 2 {
		require.Equal(t, len(payload), len(<-got))
	}
	require.NoError(t, d.Close())
	require.NoError(t, a.Close())
	<-d.qc.Context().Done()
	<-a.qc.Context().Done()
	require.Equal(t, codeDone, closeCode(t, d.qc), "dialer's connection close code")
	require.Equal(t, codeDone, closeCode(t, a.qc), "listener's connection close code")
}

// closeCode returns the application error code a closed QUIC connection ended with.
func closeCode(t *testing.T, qc *quic.Conn) quic.ApplicationErrorCode {
	t.Helper()
	var ae *quic.ApplicationError
	require.ErrorAs(t, context.Cause(qc.Context()), &ae)
	return ae.ErrorCode
}

// TestQUICCloseThenPeerReads closes right after a large Write, before the peer has read
// anything: the peer still reads all of it, then io.EOF.
func TestQUICCloseThenPeerReads(t *testing.T) {
	sopts, copts := quicOptions(t)
	ln, err := ListenQUIC("udp", "127.0.0.1:0", sopts)
	require.NoError(t, err)
	defer ln.Close()

	payload := bytes.Repeat([]byte{7}, 4<<20)
	d, a := quicPipe(t, ln, copts)
	done := make(chan error, 1)
	go func() {
		_, err := a.Write(payload)
		done <- errors.Join(err, a.Close())
	}()
	b, err := io.ReadAll(d)
	require.NoError(t, err)
	require.Equal(t, len(payload), len(b))
	require.NoError(t, <-done)
	require.NoError(t, d.Close())
	_, err = d.Read(make([]byte, 1))
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = d.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, d.Close(), net.ErrClosed)
}

func TestQUICListenerStalledClient(t *testing.T) {
	sopts, copts := quicOptions(t)
	sopts.StreamTimeout = 200 * time.Millisecond
	ln, err := ListenQUIC("udp", "127.0.0.1:0", sopts)
	require.NoError(t, err)
	defer ln.Close()

	// A client that completes the QUIC handshake but never writes.
	stalled, err := DialQUIC(context.Background(), "udp", ln.Addr().String(), copts)
	require.NoError(t, err)
	defer stalled.Close()

	d, a := quicPipe(t, ln, copts)
	d.Close()
	a.Close()

	// The listener gives up on the stalled client, which sees its connection end.
	<-stalled.qc.Context().Done()
	require.Equal(t, codeNoStream, closeCode(t, stalled.qc))
}

func TestQUICListenerCloseKeepsAccepted(t *testing.T) {
	sopts, copts := quicOptions(t)
	ln, err := ListenQUIC("udp", "127.0.0.1:0", sopts)
	require.NoError(t, err)
	d, a := quicPipe(t, ln, copts)
	require.NoError(t, ln.Close())
	require.ErrorIs(t, ln.Close(), net.ErrClosed)
	_, err = ln.Accept()
	require.ErrorIs(t, err, net.ErrClosed)

	// The accepted connection still works after its listener closed.
	_, err = d.Write([]byte("ping"))
	require.NoError(t, err)
	b := make([]byte, 4)
	_, err = io.ReadFull(a, b)
	require.NoError(t, err)
	require.Equal(t, "ping", string(b))
	require.NoError(t, d.Close())
	require.NoError(t, a.Close())
}

func TestListenTCPAndQUIC(t *testing.T) {
	sopts, copts := quicOptions(t)
	tl, ql, err := ListenTCPAndQUIC("tcp", "127.0.0.1:0", 0, sopts)
	require.NoError(t, err)
	defer tl.Close()
	defer ql.Close()
	tp := tl.Addr().(*net.TCPAddr).Port
	require.Equal(t, tp, ql.Addr().(*net.UDPAddr).Port, "TCP and UDP port numbers")

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tp))
	tc, err := DialTCP(context.Background(), "tcp", addr, 0)
	require.NoError(t, err)
	defer tc.Close()
	ts, err := tl.Accept()
	require.NoError(t, err)
	ts.Close()

	qc, err := DialQUIC(context.Background(), "tcp", addr, copts)
	require.NoError(t, err)
	_, err = qc.Write([]byte{1})
	require.NoError(t, err)
	qs, err := ql.Accept()
	require.NoError(t, err)
	qc.Close()
	qs.Close()
}

func TestNetworkNames(t *testing.T) {
	tests := []struct {
		network string
		tcp     bool   // a TCP network name
		udp     string // the UDP network QUIC uses for it, "" if none
	}{
		{"tcp", true, "udp"},
		{"tcp4", true, "udp4"},
		{"tcp6", true, "udp6"},
		{"udp", false, "udp"},
		{"udp6", false, "udp6"},
		{"unix", false, ""},
		{"ip", false, ""},
	}
	for _, tt := range tests {
		err := checkTCPNetwork(tt.network)
		require.Equal(t, tt.tcp, err == nil, "checkTCPNetwork(%q) = %v", tt.network, err)
		udp, err := udpNetwork(tt.network)
		require.Equal(t, tt.udp, udp, "udpNetwork(%q)", tt.network)
		if tt.udp == "" {
			var unk net.UnknownNetworkError
			require.ErrorAs(t, err, &unk, "udpNetwork(%q)", tt.network)
		}
	}
	sopts, _ := quicOptions(t)
	_, err := ListenTCP("unix", "127.0.0.1:0", 0)
	require.ErrorContains(t, err, "unknown network unix")
	_, err = ListenQUIC("unix", "127.0.0.1:0", sopts)
	require.ErrorContains(t, err, "unknown network unix")
	_, err = ListenQUIC("udp", "127.0.0.1:0", &QUICOptions{})
	require.ErrorContains(t, err, "QUIC needs a TLS configuration")
	_, err = DialQUIC(context.Background(), "udp", "127.0.0.1:1", nil)
	require.ErrorContains(t, err, "QUIC needs a TLS configuration")
}

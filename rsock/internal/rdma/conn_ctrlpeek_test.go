package rdma

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// TestControlEnded checks the peek at the control socket: it says the channel ended
// only when the peer closed it (or half-closed it) with nothing unread before the end,
// and it takes nothing off the socket.
func TestControlEnded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		peer  func(t *testing.T, peer net.Conn) // what the far end does first
		ended bool
		left  string // what a Read of ours then finds, before io.EOF
	}{
		{name: "open and silent", peer: func(*testing.T, net.Conn) {}},
		{name: "a keepalive waits", ended: false, left: "K", peer: func(t *testing.T, p net.Conn) {
			_, err := p.Write(ctrlKeepalive[:])
			require.NoError(t, err)
		}},
		{name: "a keepalive, then the end", ended: false, left: "K", peer: func(t *testing.T, p net.Conn) {
			_, err := p.Write(ctrlKeepalive[:])
			require.NoError(t, err)
			require.NoError(t, p.Close())
		}},
		{name: "closed", ended: true, peer: func(t *testing.T, p net.Conn) {
			require.NoError(t, p.Close())
		}},
		{name: "half-closed", ended: true, peer: func(t *testing.T, p net.Conn) {
			require.NoError(t, p.(*net.TCPConn).CloseWrite())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ours, peer := tcpPair(t)
			defer ours.Close()
			defer peer.Close()
			tc.peer(t, peer)
			c := &Conn{ctrl: ours}
			if tc.ended || tc.left != "" {
				// The bytes or the end cross loopback: wait for them to be readable
				// without taking them, as the peek itself does not.
				requireReadable(t, ours)
			}
			require.Equal(t, tc.ended, c.controlEnded())
			require.Equal(t, tc.ended, c.controlEnded(), "a second look finds the same")
			got := make([]byte, len(tc.left))
			_, err := io.ReadFull(ours, got)
			require.NoError(t, err)
			require.Equal(t, tc.left, string(got), "the peek took bytes off the socket")
			if tc.ended {
				_, err = ours.Read(make([]byte, 1))
				require.ErrorIs(t, err, io.EOF)
			}
		})
	}
}

// TestControlEndedWithoutSocket: a control channel with no socket (net.Pipe here, a
// QUIC stream in rsock) is never found ended by a peek; its reader says so as before.
func TestControlEndedWithoutSocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	require.NoError(t, b.Close())
	c := &Conn{ctrl: a}
	require.False(t, c.controlEnded())
}

// TestUseControlSocket: a Conn handed its control socket's handle peeks through it,
// even where its control channel exposes no socket of its own (net.Pipe here stands for
// a wrapper the handshake saw through), and a handle of nil leaves it to look for one.
func TestUseControlSocket(t *testing.T) {
	ours, peer := tcpPair(t)
	defer ours.Close()
	require.NoError(t, peer.Close())
	requireReadable(t, ours)
	raw, err := ours.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	pipe, other := net.Pipe()
	defer pipe.Close()
	defer other.Close()

	c := &Conn{ctrl: pipe}
	c.UseControlSocket(raw)
	require.True(t, c.controlEnded(), "the peek did not use the socket handed over")

	c = &Conn{ctrl: ours}
	c.UseControlSocket(nil)
	require.True(t, c.controlEnded(), "without a handle, the peek finds the socket itself")
}

// requireReadable waits, without reading, until conn has something to read or its end:
// a blocking poll on the socket (the bytes are on loopback already, or about to be).
func requireReadable(t *testing.T, conn net.Conn) {
	t.Helper()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	require.NoError(t, raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, err := recvPeek(fd, b[:])
		return err == nil // EAGAIN: wait in the netpoller, then look again
	}))
}

// deafControl is a control channel whose reads never return until the test releases
// them: the Conn's control reader never learns of the channel's end by itself. The
// socket itself stays reachable (SyscallConn, CloseWrite: *net.TCPConn's).
type deafControl struct {
	*net.TCPConn
	release chan struct{}
}

func (d *deafControl) Read(b []byte) (int, error) {
	<-d.release
	return d.TCPConn.Read(b)
}

// TestCloseAfterPeerSeesControlEnd: a Close that follows the peer's learns from the
// control socket itself that the peer is gone, and so returns without waiting for its
// control reader, which here never wakes. It also shows that the peer's Close
// half-closes its control channel at once: the peer's channel is never fully closed
// here (its Close is held), yet the end arrives.
func TestCloseAfterPeerSeesControlEnd(t *testing.T) {
	f := soft.New(soft.Options{})
	ca, cb := tcpPair(t)
	gate := &closeGate{Conn: ca, entered: make(chan struct{}), open: make(chan struct{})}
	deaf := &deafControl{TCPConn: cb.(*net.TCPConn), release: make(chan struct{})}
	// A drain that missed the end would wait for its FIN toward a torn-down QP until
	// soft's transport retries ran out, and fail the Conn.
	a, b := connPairOver(t, f, loopback.String(), loopback.String(), Options{}, halfCloser{gate}, deaf)

	closeAfterLastWords(t, a, b)
	require.NoError(t, b.Close(), "the Close that followed the peer's")
	b.mu.Lock()
	gone := b.peerGone
	b.mu.Unlock()
	require.True(t, gone, "the drain ended without learning the peer was gone")
	// The drain's own record (Close has returned: nothing else writes it). The Conn's
	// error says nothing here: the teardown that follows the drain flushes the FIN
	// that never completed, and that completion may or may not reach the Conn first.
	require.True(t, b.peek.ended, "the drain ended without its peek finding the channel's end")

	close(deaf.release) // the control readers end: TestMain's goleak checks they did
	<-gate.entered
	close(gate.open)
	requireReleased(t, f)
}

// halfCloser gives a closeGate the socket's CloseWrite, which net.Conn does not promote.
type halfCloser struct{ *closeGate }

func (h halfCloser) CloseWrite() error { return h.closeGate.Conn.(*net.TCPConn).CloseWrite() }

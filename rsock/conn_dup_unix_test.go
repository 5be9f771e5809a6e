//go:build unix

package rsock

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestDupSocketKeepsNonBlocking: making the duplicate closeBeforeReply reads the answer
// on never puts the socket in blocking mode (tcp.File with net.FileConn did, for a
// moment in which a racing Write could block for ever), and the duplicate reads what the
// peer sends after the original is closed.
func TestDupSocketKeepsNonBlocking(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	srv, ok := <-accepted
	require.True(t, ok)
	defer srv.Close()
	tcp := c.(*net.TCPConn)

	nonBlocking := func() bool {
		raw, err := tcp.SyscallConn()
		require.NoError(t, err)
		var flags int
		var ferr error
		require.NoError(t, raw.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }))
		require.NoError(t, ferr)
		return flags&unix.O_NONBLOCK != 0
	}
	require.True(t, nonBlocking())
	// A watcher looks at the mode while duplicates are made: with tcp.File and
	// net.FileConn it catches the blocking moment within a few hundred rounds.
	stop, sawBlocking := make(chan struct{}), make(chan bool, 1)
	go func() {
		saw := false
		for !saw {
			select {
			case <-stop:
				sawBlocking <- false
				return
			default:
			}
			saw = !nonBlocking()
		}
		sawBlocking <- true
	}()
	for range 2000 {
		k, err := dupSocket(tcp)
		require.NoError(t, err)
		k.Close()
	}
	close(stop)
	require.False(t, <-sawBlocking, "the socket was in blocking mode while it was duplicated")
	keep, err := dupSocket(tcp)
	require.NoError(t, err)
	defer keep.Close()

	require.NoError(t, tcp.Close())
	_, err = srv.Write([]byte("answer"))
	require.NoError(t, err)
	got := make([]byte, 6)
	_, err = io.ReadFull(keep, got)
	require.NoError(t, err)
	require.Equal(t, "answer", string(got))
}

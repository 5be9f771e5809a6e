package shm

import (
	"io"
	"net"
	"os"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
)

// TestMsgReader: datagrams, descriptors and the peer's close, as the reader sees them.
func TestMsgReader(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close() // FileConn has its own descriptor
		c, err := net.FileConn(f)
		require.NoError(t, err)
		return c.(*net.UnixConn)
	}
	a, b := conn(fds[0]), conn(fds[1])
	defer a.Close()
	r, err := newMsgReader(b, 16, unix.CmsgSpace(4))
	require.NoError(t, err)

	_, _, err = a.WriteMsgUnix([]byte("hello"), nil, nil)
	require.NoError(t, err)
	n, oobn, flags, err := r.read()
	require.NoError(t, err)
	require.Equal(t, "hello", string(r.buf[:n]))
	require.Zero(t, oobn)
	require.Zero(t, flags&unix.MSG_TRUNC)

	_, _, err = a.WriteMsgUnix(make([]byte, 17), nil, nil)
	require.NoError(t, err)
	_, _, flags, err = r.read()
	require.NoError(t, err)
	require.NotZero(t, flags&unix.MSG_TRUNC, "a datagram longer than the buffer is reported truncated")

	fd := sealedMemfd(t, 4096, true)
	_, _, err = a.WriteMsgUnix([]byte("fd"), unix.UnixRights(fd), nil)
	unix.Close(fd)
	require.NoError(t, err)
	_, oobn, _, err = r.read()
	require.NoError(t, err)
	got := parseFDs(r.oob[:oobn])
	require.Len(t, got, 1)
	closeFDs(got)

	require.NoError(t, a.Close())
	_, _, _, err = r.read()
	require.ErrorIs(t, err, io.EOF)
	b.Close()
}

// TestWriteWithImmAllocs: a WRITE_WITH_IMM's post, execution (on both sides' goroutines)
// and completions allocate nothing once the region is mapped.
func TestWriteWithImmAllocs(t *testing.T) {
	p := newProvider(t, 2)
	x := newEnd(t, p, "shm0", 4096)
	y := newEnd(t, p, "shm1", 4096)
	// ACK timeout 0: on a loaded machine an answer can take longer than any timeout,
	// and the retransmission's new connection would allocate.
	connectEnds(t, x, y, 0, 7)
	wr := []verbs.SendWR{writeImm(1, x.mr, y.mr, 0, 64)}
	recv := []verbs.RecvWR{{ID: 1}}
	var wc [2]verbs.WorkCompletion
	round := func() {
		require.NoError(t, y.qp.PostRecv(recv))
		require.NoError(t, x.qp.PostSend(wr))
		for got := 0; got < 2; {
			n, err := x.cq.Poll(wc[:])
			require.NoError(t, err)
			k, err := y.cq.Poll(wc[n:])
			require.NoError(t, err)
			if got += n + k; n+k == 0 {
				runtime.Gosched()
			}
		}
	}
	round() // maps the region
	allocs := testing.AllocsPerRun(200, round)
	require.Zero(t, allocs, "allocations per WRITE_WITH_IMM round")
}

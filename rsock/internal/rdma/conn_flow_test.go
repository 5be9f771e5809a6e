package rdma

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// arrive plays the peer's RDMA_WRITE_WITH_IMM of kind into c's ring at off: the bytes
// land, then the receive completion reaches the Conn, as the poller would hand it.
func arrive(t *testing.T, c *Conn, wqe uint64, kind flowctl.Kind, off int, data string) {
	t.Helper()
	imm, err := flowctl.Imm{Kind: kind}.Encode()
	require.NoError(t, err)
	copy(c.ring[off:], data)
	c.onCompletion(&verbs.WorkCompletion{
		WRID: recvWRFlag | wqe, Status: verbs.WCSuccess, Opcode: verbs.WCRecvRDMAWithImm,
		Flags: verbs.WCWithImm, Imm: imm, ByteLen: uint32(len(data)),
	})
}

// TestRecvPathWithFakeQP drives the receive path without a provider: each arrival
// re-posts its receive WQE with the same ID, the bytes are read out of the ring in
// order, and a FIN ends the stream with EOF.
func TestRecvPathWithFakeQP(t *testing.T) {
	q := &fakeQP{}
	c := newFakeConn(t, q)
	arrive(t, c, 3, flowctl.KindData, 0, "hello, ")
	arrive(t, c, 4, flowctl.KindData, 7, "ring")
	q.mu.Lock()
	require.Equal(t, []verbs.RecvWR{{ID: recvWRFlag | 3}, {ID: recvWRFlag | 4}}, q.recvs, "each WQE re-posted")
	q.mu.Unlock()

	buf := make([]byte, 64)
	n, err := c.Read(buf)
	require.NoError(t, err)
	got := string(buf[:n])
	for len(got) < len("hello, ring") {
		n, err = c.Read(buf)
		require.NoError(t, err)
		got += string(buf[:n])
	}
	require.Equal(t, "hello, ring", got)

	arrive(t, c, 5, flowctl.KindFIN, 0, "")
	_, err = c.Read(buf)
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, connErr(c))
}

// TestRecvViolations: an arrival the protocol does not allow fails the Conn with
// ErrProtocol, moves the QP to ERROR, and fails Reads; a receive WQE that cannot be
// re-posted fails it with ErrQPFailed.
func TestRecvViolations(t *testing.T) {
	dataImm, err := flowctl.Imm{Kind: flowctl.KindData}.Encode()
	require.NoError(t, err)
	tests := []struct {
		name    string
		postErr bool
		wc      verbs.WorkCompletion
		want    error
	}{
		{
			name: "a SEND instead of a write with immediate",
			wc:   verbs.WorkCompletion{WRID: recvWRFlag | 1, Opcode: verbs.WCRecv, ByteLen: 4},
			want: ErrProtocol,
		},
		{
			name: "no immediate",
			wc:   verbs.WorkCompletion{WRID: recvWRFlag | 1, Opcode: verbs.WCRecvRDMAWithImm, ByteLen: 4},
			want: ErrProtocol,
		},
		{
			name: "more bytes than the ring holds",
			wc: verbs.WorkCompletion{WRID: recvWRFlag | 1, Opcode: verbs.WCRecvRDMAWithImm,
				Flags: verbs.WCWithImm, Imm: dataImm, ByteLen: fakeRing + 1},
			want: ErrProtocol,
		},
		{
			name:    "the WQE cannot be re-posted",
			postErr: true,
			wc: verbs.WorkCompletion{WRID: recvWRFlag | 1, Opcode: verbs.WCRecvRDMAWithImm,
				Flags: verbs.WCWithImm, Imm: dataImm, ByteLen: 4},
			want: ErrQPFailed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &fakeQP{}
			if tt.postErr {
				q.postErr = io.ErrClosedPipe
			}
			c := newFakeConn(t, q)
			c.onCompletion(&tt.wc)
			require.ErrorIs(t, connErr(c), tt.want)
			_, err := c.Read(make([]byte, 8))
			require.ErrorIs(t, err, tt.want)
			q.mu.Lock()
			require.Equal(t, 1, q.toError, "QP moved to ERROR once")
			q.mu.Unlock()
		})
	}
}

package rdma

import (
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
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

// TestStaleCompletionsAfterQPNReuse hands a Conn the completions a destroyed QP of the
// same number left in the shared CQ (flushed sends and receives of another generation):
// it drops them and carries on, and still fails on a flush of its own. Then, on a soft
// fabric that leaves destroyed QPs' completions in the CQ and reuses QP numbers at once
// (as kernels may), connections are opened and closed in a row next to a busy one on
// the same CQ, and every one of them works.
func TestStaleCompletionsAfterQPNReuse(t *testing.T) {
	t.Run("fake QP", func(t *testing.T) {
		old, cur := newGen(), newGen()
		c := newFakeConn(t, &fakeQP{qpn: 5})
		c.gen = cur
		stale := []verbs.WorkCompletion{
			{WRID: old, Status: verbs.WCWRFlushErr, QPN: 5}, // send sequence 0
			{WRID: recvWRFlag | old | 3, Status: verbs.WCWRFlushErr, QPN: 5},
			{WRID: old | 7, Status: verbs.WCSuccess, Opcode: verbs.WCRDMAWrite, QPN: 5},
		}
		for i := range stale {
			c.onCompletion(&stale[i])
		}
		require.NoError(t, connErr(c), "completions of another generation are not this Conn's")
		require.Equal(t, uint64(len(stale)), c.stale.Load())
		c.onCompletion(&verbs.WorkCompletion{WRID: recvWRFlag | cur | 3, Status: verbs.WCWRFlushErr, QPN: 5})
		require.ErrorIs(t, connErr(c), ErrQPFailed, "a flush of its own generation fails the Conn")
	})

	t.Run("soft with the kernel's teardown", func(t *testing.T) {
		f := soft.New(soft.Options{})
		f.LeaveDestroyedCompletions(true)
		f.ReuseQPNs(true)
		opts := Options{RingSize: 16 << 10, SendBufferSize: 8 << 10}
		x, y := connPair(t, f, opts)
		bystander(t, x, y, func() {
			qpns := make(map[uint32]int)
			for i := range 50 {
				a, b := connPair(t, f, opts)
				qpns[a.qp.QPN()]++
				msg := []byte{byte(i)}
				_, err := a.Write(msg)
				require.NoError(t, err, "connection %d", i)
				got := make([]byte, 1)
				_, err = io.ReadFull(b, got)
				require.NoError(t, err, "connection %d", i)
				require.Equal(t, msg, got)
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
			}
			require.Less(t, len(qpns), 50, "QP numbers were reused")
		})
		x.Close()
		y.Close()
		requireReleased(t, f)
	})
}

// causeQP is a fakeQP that knows why its transport failed (verbs.TransportCauser).
type causeQP struct {
	fakeQP
	cause error
}

func (q *causeQP) TransportCause() error { return q.cause }

// TestTransportCause: a completion that failed for want of an answer names the local
// cause its QP knows (shm's: out of files to reach the peer), on a data WR and on the
// proof alike; other failures, and QPs that know none, keep the status alone.
func TestTransportCause(t *testing.T) {
	emfile := fmt.Errorf("shm: dial QP 0x7: socket: %w", syscall.EMFILE)
	tests := []struct {
		name   string
		qp     queuePair
		wc     verbs.WorkCompletion
		cause  bool   // the Conn's error wraps emfile
		status string // and says the completion's status
	}{
		{"a send, retries spent", &causeQP{cause: emfile},
			verbs.WorkCompletion{WRID: 3, Status: verbs.WCRetryExcErr}, true, "transport retry counter exceeded"},
		{"the proof, retries spent", &causeQP{cause: emfile},
			verbs.WorkCompletion{WRID: recvWRFlag | proofRecvIndex, Status: verbs.WCRetryExcErr}, true, "transport retry counter exceeded"},
		{"a send, remote access error", &causeQP{cause: emfile},
			verbs.WorkCompletion{WRID: 3, Status: verbs.WCRemAccessErr}, false, "remote access error"},
		{"a QP that knows no cause", &causeQP{},
			verbs.WorkCompletion{WRID: 3, Status: verbs.WCRetryExcErr}, false, "transport retry counter exceeded"},
		{"a QP that cannot tell", &fakeQP{},
			verbs.WorkCompletion{WRID: 3, Status: verbs.WCRetryExcErr}, false, "transport retry counter exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeConn(t, &fakeQP{})
			c.qp = tt.qp
			c.onCompletion(&tt.wc)
			err := connErr(c)
			require.ErrorIs(t, err, ErrQPFailed)
			require.ErrorContains(t, err, tt.status)
			if tt.cause {
				require.ErrorIs(t, err, syscall.EMFILE)
				require.ErrorContains(t, err, "too many open files")
			} else {
				require.NotErrorIs(t, err, syscall.EMFILE)
			}
		})
	}
}

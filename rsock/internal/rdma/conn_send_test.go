package rdma

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// TestWritePostsWriteWithImm checks what Write hands the QP: one RDMA_WRITE_WITH_IMM
// per chunk, into the peer's ring with its rkey, from the staging buffer holding the
// bytes, numbered in order, every signalEvery-th signaled; and that a signaled
// completion frees the staging and send-queue space of the WRs up to it.
func TestWritePostsWriteWithImm(t *testing.T) {
	q := &fakeQP{}
	c := newFakeConn(t, q)
	msgs := []string{"hello", "rdma", "world"}
	for _, m := range msgs {
		n, err := c.Write([]byte(m))
		require.NoError(t, err)
		require.Equal(t, len(m), n)
	}
	wrs := q.posted()
	require.Len(t, wrs, len(msgs))
	var off uint64
	for i, wr := range wrs {
		require.Equal(t, uint64(i), wr.ID, "WR IDs are send sequence numbers")
		require.Equal(t, verbs.OpRDMAWriteWithImm, wr.Opcode)
		require.Equal(t, uint32(fakePeerRKey), wr.RKey)
		require.Equal(t, fakePeerRing+off, wr.RemoteAddr, "message %d lands after the previous", i)
		require.Len(t, wr.SGL, 1)
		require.Equal(t, uint32(fakeStageKey), wr.SGL[0].LKey)
		require.Equal(t, msgs[i], string(staged(c, wr.SGL[0])))
		dec, err := flowctl.DecodeImm(wr.Imm, wr.SGL[0].Length)
		require.NoError(t, err)
		require.Equal(t, flowctl.KindData, dec.Kind, "message %d", i)
		require.Equal(t, i%2 == 1, wr.Flags&verbs.SendSignaled != 0, "every 2nd WR signaled: WR %d", i)
		off += uint64(len(msgs[i]))
	}

	c.onCompletion(&verbs.WorkCompletion{WRID: 1, Status: verbs.WCSuccess, Opcode: verbs.WCRDMAWrite})
	c.mu.Lock()
	require.Equal(t, uint64(2), c.sqDone, "WRs 0 and 1 retired")
	require.Equal(t, uint64(len(msgs[0])+len(msgs[1])), c.stageHead, "their staging freed")
	c.mu.Unlock()
	require.NoError(t, connErr(c))
}

// TestWriteWaitsForSendQueue checks that a writer with the send queue full waits, here
// until its deadline, and that a completion lets it go on.
func TestWriteWaitsForSendQueue(t *testing.T) {
	q := &fakeQP{}
	c := newFakeConn(t, q)
	// A data post may take two WRs: the queue takes depth-1 one-WR writes.
	for range fakeSQDepth - 1 {
		_, err := c.Write([]byte("x"))
		require.NoError(t, err)
	}
	require.NoError(t, c.SetWriteDeadline(time.Unix(1, 0)))
	n, err := c.Write([]byte("y"))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Zero(t, n)
	require.Len(t, q.posted(), fakeSQDepth-1)

	var last *verbs.SendWR
	for _, wr := range q.posted() {
		if wr.Flags&verbs.SendSignaled != 0 {
			last = &wr
		}
	}
	require.NotNil(t, last, "a full queue has a completion coming")
	c.onCompletion(&verbs.WorkCompletion{WRID: last.ID, Status: verbs.WCSuccess})
	require.NoError(t, c.SetWriteDeadline(time.Time{}))
	_, err = c.Write([]byte("y"))
	require.NoError(t, err)
	require.Len(t, q.posted(), fakeSQDepth)
}

// TestSendFailures: each way the send path can fail makes the Conn's sticky error,
// moves the QP to ERROR once, and fails later Writes with the same error.
func TestSendFailures(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name  string
		setup func(c *Conn, q *fakeQP)
		want  error
	}{
		{
			name:  "post send fails",
			setup: func(c *Conn, q *fakeQP) { q.postErr = boom },
			want:  ErrQPFailed,
		},
		{
			name: "error completion",
			setup: func(c *Conn, q *fakeQP) {
				c.onCompletion(&verbs.WorkCompletion{WRID: 0, Status: verbs.WCRemAccessErr})
			},
			want: ErrQPFailed,
		},
		{
			name: "completion of a send never posted",
			setup: func(c *Conn, q *fakeQP) {
				c.onCompletion(&verbs.WorkCompletion{WRID: 5, Status: verbs.WCSuccess})
			},
			want: ErrQPFailed,
		},
		{
			name:  "shared CQ fails",
			setup: func(c *Conn, q *fakeQP) { c.onCQError(verbs.ErrCQOverflow) },
			want:  ErrCQFailed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &fakeQP{}
			c := newFakeConn(t, q)
			tt.setup(c, q)
			_, err := c.Write([]byte("data"))
			require.ErrorIs(t, err, tt.want)
			require.ErrorIs(t, connErr(c), tt.want)
			_, err2 := c.Write([]byte("more"))
			require.Equal(t, err, err2, "the error is sticky")
			q.mu.Lock()
			require.Equal(t, 1, q.toError, "QP moved to ERROR once")
			q.mu.Unlock()
		})
	}
}

// TestSignaledByNeed: below half the staging buffer in flight only every signalEvery-th
// WR is signaled; above it, one WR per quarter of the buffer, not every one; and a
// writer that has filled the buffer has a signaled WR in flight whose completion lets it
// go on.
func TestSignaledByNeed(t *testing.T) {
	const kib = 1 << 10 // fakeStage is 16 KiB: writes of 1 KiB, none completed
	tests := []struct {
		name        string
		signalEvery uint64
		writes      int
		want        []int // indexes of the signaled WRs
	}{
		{"below half the buffer", 1000, 7, nil},
		{"one per quarter above half", 1000, 16, []int{7, 11, 15}},
		{"every signalEvery-th below half", 3, 7, []int{2, 5}},
		{"both", 3, 16, []int{2, 5, 8, 11, 14}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &fakeQP{}
			c := newFakeConn(t, q)
			c.sqDepth, c.stageEnd, c.signalEvery = 64, make([]uint64, 64), tt.signalEvery
			for range tt.writes {
				_, err := c.Write(make([]byte, kib))
				require.NoError(t, err)
			}
			var got []int
			for i, wr := range q.posted() {
				if wr.Flags&verbs.SendSignaled != 0 {
					got = append(got, i)
				}
			}
			require.Equal(t, tt.want, got, "signaled WRs of %d 1 KiB writes into %d KiB of staging", tt.writes, fakeStage/kib)
		})
	}

	// The buffer full, the last signaled WR's completion frees it.
	q := &fakeQP{}
	c := newFakeConn(t, q)
	c.sqDepth, c.stageEnd, c.signalEvery = 64, make([]uint64, 64), 1000
	for range fakeStage / kib {
		_, err := c.Write(make([]byte, kib))
		require.NoError(t, err)
	}
	c.mu.Lock()
	room := c.writeRoomLocked()
	c.mu.Unlock()
	require.Zero(t, room, "staging full")
	wrs := q.posted()
	last := wrs[len(wrs)-1]
	require.NotZero(t, last.Flags&verbs.SendSignaled, "the WR that filled the buffer is not signaled")
	c.onCompletion(&verbs.WorkCompletion{WRID: last.ID, Status: verbs.WCSuccess, Opcode: verbs.WCRDMAWrite})
	c.mu.Lock()
	room = c.writeRoomLocked()
	c.mu.Unlock()
	require.Equal(t, fakeStage/4, room, "room after the completion (one chunk)")
}

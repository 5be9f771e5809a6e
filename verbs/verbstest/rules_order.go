package verbstest

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// testOrdering: a QP executes and completes its WRs in order, and a WR that must wait
// (here for a receive WQE) holds back every WR behind it.
func testOrdering(t *testing.T, p providers) {
	t.Run("Completions", func(t *testing.T) {
		a, b := newPair(t, p, defaults())
		const n = 48
		postRecvs(t, b.qp, 0, n/3)
		var wrs []verbs.SendWR
		for i := range n {
			// Writes of growing sizes to one place, every third with an immediate:
			// the last one's bytes must win, and completions must come in post order.
			size := 1 + i*97
			a.mr.Bytes()[4096*(i%8)] = byte(i)
			op := verbs.OpRDMAWrite
			if i%3 == 2 {
				op = verbs.OpRDMAWriteWithImm
			}
			wrs = append(wrs, writeWR(uint64(i), a.mr, 4096*(i%8), size, b.mr, 0, op, verbs.SendSignaled))
		}
		post(t, a.qp, wrs[:n/2]...)
		post(t, a.qp, wrs[n/2:]...)
		for i, wc := range pollN(t, a.scq, n) {
			requireWC(t, wc, uint64(i), verbs.WCSuccess)
		}
		for i, wc := range pollN(t, b.rcq, n/3) {
			requireWC(t, wc, uint64(i), verbs.WCSuccess)
			require.Equal(t, uint32(3*i+2), wc.Imm, "immediate of receive %d", i)
		}
		require.Equal(t, byte(n-1), b.mr.Bytes()[0], "first byte after the last write")
	})

	t.Run("StalledHeadHoldsBack", func(t *testing.T) {
		a, b := newPair(t, p, defaults())
		fill(a.mr.Bytes()[:256], 4)
		post(t, a.qp,
			sendWR(1, a.mr, 0, 64, verbs.SendSignaled), // no receive WQE yet: RNR
			writeWR(2, a.mr, 64, 64, b.mr, 1024, verbs.OpRDMAWrite, verbs.SendSignaled),
			writeWR(3, a.mr, 128, 64, b.mr, 2048, verbs.OpRDMAWriteWithImm, verbs.SendSignaled),
		)
		// The write behind the stalled SEND has not been executed.
		require.Equal(t, make([]byte, 64), b.mr.Bytes()[1024:1088], "write executed ahead of a stalled SEND")
		requireEmpty(t, a.scq, "WRs behind a stalled SEND")

		postRecv(t, b.qp, verbs.RecvWR{ID: 10, SGL: []verbs.SGE{sge(b.mr, 0, 64)}}, verbs.RecvWR{ID: 11})
		wcs := pollN(t, a.scq, 3)
		for i, wc := range wcs {
			requireWC(t, wc, uint64(i+1), verbs.WCSuccess)
		}
		rwcs := pollN(t, b.rcq, 2)
		requireWC(t, rwcs[0], 10, verbs.WCSuccess)
		require.Equal(t, verbs.WCRecv, rwcs[0].Opcode)
		requireWC(t, rwcs[1], 11, verbs.WCSuccess)
		require.Equal(t, verbs.WCRecvRDMAWithImm, rwcs[1].Opcode)
		require.Equal(t, a.mr.Bytes()[:64], b.mr.Bytes()[:64])
		require.Equal(t, a.mr.Bytes()[64:128], b.mr.Bytes()[1024:1088])
		require.Equal(t, a.mr.Bytes()[128:192], b.mr.Bytes()[2048:2112])
	})
}

// testWriteWithImmVisible: the payload of an RDMA WRITE_WITH_IMM is in the target region
// when its receive completion is polled. The receiver is side a, in this process (the
// sender, side b, may be a remote peer): a goroutine busy-polls and checks each message the
// moment it sees its completion; the sender posts the next message only once the receiver
// has checked the last, so the receiver is always polling while a message is being placed.
// Under the race detector, a provider that added the completion before the data would also
// be reported as a data race.
func testWriteWithImmVisible(t *testing.T, p providers) {
	sizes := []int{1, 64, 4096, 65536, 1 << 20}
	const msgs = 30
	offsets := make([]int, msgs+1)
	for i := range msgs {
		offsets[i+1] = offsets[i] + sizes[i%len(sizes)]
	}
	cfg := defaults()
	cfg.mrSize = offsets[msgs]
	recv, send := newPair(t, p, cfg)
	want := make([]byte, offsets[msgs])
	for i := range msgs {
		fill(want[offsets[i]:offsets[i+1]], i+1)
	}
	writeBytes(t, send.mr, 0, want)
	postRecvs(t, recv.qp, 0, msgs)

	checked := make(chan error)
	go func() {
		var wc [1]verbs.WorkCompletion
		deadline := time.Now().Add(waitLimit)
		for i, spins := 0, 0; i < msgs; spins++ {
			n, err := recv.rcq.Poll(wc[:])
			if err != nil {
				checked <- err
				return
			}
			if n == 0 {
				if spins%1024 == 1023 {
					if time.Now().After(deadline) {
						checked <- fmt.Errorf("message %d never arrived", i)
						return
					}
					runtime.Gosched()
				}
				continue
			}
			c := wc[0]
			if c.Status != verbs.WCSuccess || int(c.Imm) != i || int(c.ByteLen) != offsets[i+1]-offsets[i] {
				checked <- fmt.Errorf("receive completion %+v, want message %d", c, i)
				return
			}
			var err2 error
			if !bytes.Equal(want[offsets[i]:offsets[i+1]], recv.mr.Bytes()[offsets[i]:offsets[i+1]]) {
				err2 = fmt.Errorf("message %d (%d bytes) not in place when its completion was polled", i, c.ByteLen)
			}
			checked <- err2
			if err2 != nil {
				return
			}
			i++
		}
	}()
	for i := range msgs {
		wr := writeWR(uint64(i), send.mr, offsets[i], offsets[i+1]-offsets[i], recv.mr, offsets[i], verbs.OpRDMAWriteWithImm, verbs.SendSignaled)
		wr.Imm = uint32(i)
		post(t, send.qp, wr)
		require.NoError(t, <-checked)
		requireWC(t, pollOne(t, send.scq), uint64(i), verbs.WCSuccess)
	}
}

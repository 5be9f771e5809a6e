package rdma

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// TestSendProof: the proof is the QP's first send WR, a signaled SEND of its bytes out
// of staging, numbered like any send; a second proof, an empty or oversized one, is
// refused.
func TestSendProof(t *testing.T) {
	q := &fakeQP{}
	c := newFakeConn(t, q)
	require.Error(t, c.SendProof(nil), "empty proof")
	require.Error(t, c.SendProof(make([]byte, ProofMaxLen+1)), "oversized proof")
	require.NoError(t, c.SendProof([]byte("proof")))
	wrs := q.posted()
	require.Len(t, wrs, 1)
	require.Equal(t, verbs.OpSend, wrs[0].Opcode)
	require.Equal(t, uint64(0), wrs[0].ID)
	require.NotZero(t, wrs[0].Flags&verbs.SendSignaled, "the proof is signaled")
	require.Len(t, wrs[0].SGL, 1)
	require.Equal(t, "proof", string(staged(c, wrs[0].SGL[0])))
	require.Error(t, c.SendProof([]byte("again")), "a second proof")

	c.onCompletion(&verbs.WorkCompletion{WRID: 0, Status: verbs.WCSuccess, Opcode: verbs.WCSend})
	c.mu.Lock()
	require.Equal(t, c.stageTail, c.stageHead, "the proof's staging is free once it completed")
	c.mu.Unlock()
	require.NoError(t, connErr(c))
}

// TestProofArrival drives the proof WQE's completion: a SEND within the WQE's buffer is
// the proof, read out of the ring's first bytes; any other first message, or a failed
// one, fails the Conn and ends the wait with ErrNoProof.
func TestProofArrival(t *testing.T) {
	const proofRecvID = recvWRFlag | proofRecvIndex // generation 0, the fake Conn's
	ok := verbs.WorkCompletion{WRID: proofRecvID, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: 5}
	tests := []struct {
		name    string
		wc      verbs.WorkCompletion
		wantErr error // nil: the proof arrived
	}{
		{name: "proof", wc: ok},
		{name: "write with immediate", wc: verbs.WorkCompletion{WRID: proofRecvID, Opcode: verbs.WCRecvRDMAWithImm, Flags: verbs.WCWithImm}, wantErr: ErrProtocol},
		{name: "send with immediate", wc: verbs.WorkCompletion{WRID: proofRecvID, Opcode: verbs.WCRecv, Flags: verbs.WCWithImm, ByteLen: 5}, wantErr: ErrProtocol},
		{name: "oversized", wc: verbs.WorkCompletion{WRID: proofRecvID, Opcode: verbs.WCRecv, ByteLen: ProofMaxLen + 1}, wantErr: ErrProtocol},
		{name: "flushed", wc: verbs.WorkCompletion{WRID: proofRecvID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv}, wantErr: ErrQPFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &fakeQP{}
			c := newFakeConn(t, q)
			_, err := c.Proof()
			require.ErrorIs(t, err, ErrNoProof, "before the completion")
			copy(c.proofSlot, "hello")
			var arrived []string // what OnProof's function read, once per call
			c.OnProof(ProofFunc(func() {
				p, err := c.Proof() // no lock is held: this would deadlock otherwise
				require.NoError(t, err, "Proof from OnProof's function")
				arrived = append(arrived, string(p))
			}))
			c.onCompletion(&tt.wc)
			select {
			case <-c.ProofDone():
			default:
				t.Fatal("ProofDone still open after the proof WQE completed")
			}
			p, err := c.Proof()
			if tt.wantErr == nil {
				require.Equal(t, []string{"hello"}, arrived, "OnProof's function calls")
				require.Nil(t, c.proof.arrived, "the handler kept after it was told")
				require.NoError(t, err)
				require.Equal(t, "hello", string(p))
				require.NoError(t, connErr(c))
				q.mu.Lock()
				require.Empty(t, q.recvs, "the proof WQE is not re-posted")
				q.mu.Unlock()
				return
			}
			require.Empty(t, arrived, "OnProof's function called for a failed proof")
			require.Nil(t, c.proof.arrived, "the handler kept after the wait ended")
			require.ErrorIs(t, err, ErrNoProof)
			require.ErrorIs(t, err, tt.wantErr)
			require.ErrorIs(t, connErr(c), tt.wantErr)
			require.Equal(t, 1, q.toError, "QP to ERROR")
		})
	}
}

// TestOnProofAfterFailure: a proof that completes after the Conn failed is not
// reported to OnProof's function; ProofDone already said the wait is over.
func TestOnProofAfterFailure(t *testing.T) {
	const proofRecvID = recvWRFlag | proofRecvIndex
	q := &fakeQP{}
	c := newFakeConn(t, q)
	calls := 0
	c.OnProof(ProofFunc(func() { calls++ }))
	c.mu.Lock()
	c.failLocked(ErrQPFailed)
	c.mu.Unlock()
	c.onCompletion(&verbs.WorkCompletion{WRID: proofRecvID, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: 5})
	require.Zero(t, calls, "OnProof's function calls after a failure")
	_, err := c.Proof()
	require.ErrorIs(t, err, ErrNoProof)
}

// TestProofWaitEndsOnFailure: a Conn that fails before the proof (its own proof's SEND
// ran out of retries, say) ends the wait; its control channel, still the handshake's,
// keeps its deadlines until Start. Once started, a failure wakes the control reader.
func TestProofWaitEndsOnFailure(t *testing.T) {
	for _, started := range []bool{false, true} {
		c := newFakeConn(t, &fakeQP{})
		rec := &deadlineRecorder{Conn: c.ctrl}
		c.ctrl = rec
		c.started = started
		c.onCompletion(&verbs.WorkCompletion{WRID: 0, Status: verbs.WCRetryExcErr, Opcode: verbs.WCSend})
		<-c.ProofDone()
		_, err := c.Proof()
		require.ErrorIs(t, err, ErrNoProof)
		require.ErrorIs(t, err, ErrQPFailed)
		want := 0
		if started {
			want = 1
		}
		require.Equal(t, want, rec.readDeadlines, "read deadlines set on the control channel, started=%v", started)
	}
}

// deadlineRecorder counts SetReadDeadline calls on a control channel.
type deadlineRecorder struct {
	net.Conn
	readDeadlines int
}

func (d *deadlineRecorder) SetReadDeadline(t time.Time) error {
	d.readDeadlines++
	return d.Conn.SetReadDeadline(t)
}

// startPair runs the proof exchange between two Conns connected to each other, as
// rsock's upgrade does before it declares the connection, and starts both.
func startPair(t testing.TB, a, b *Conn) {
	t.Helper()
	require.NoError(t, a.SendProof([]byte("proof from a")))
	require.NoError(t, b.SendProof([]byte("proof from b")))
	<-a.ProofDone()
	<-b.ProofDone()
	pa, err := a.Proof()
	require.NoError(t, err)
	pb, err := b.Proof()
	require.NoError(t, err)
	require.Equal(t, "proof from b", string(pa))
	require.Equal(t, "proof from a", string(pb))
	a.Start()
	b.Start()
}

// TestSpinProof: a wait for the peer's proof polls the CQ itself, within the poller's
// spin, and takes the proof it finds (dispatching it as the poller would); without a
// proof by the end of the spin, or with no spin at all, it leaves the wait to ProofDone;
// a Conn that failed first ends it at once, without a poll. The spinning slot is given
// back either way.
func TestSpinProof(t *testing.T) {
	proofWC := verbs.WorkCompletion{WRID: recvWRFlag | proofRecvIndex, QPN: 5, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: 5}
	for _, tc := range []struct {
		name       string
		spin       int
		push       []verbs.WorkCompletion
		failed     bool
		want       bool
		wantEmpty  uint64 // empty polls
		wantQueued int    // completions left in the CQ
	}{
		{name: "proof in the CQ", spin: 4, push: []verbs.WorkCompletion{proofWC}, want: true},
		{name: "no proof within the spin", spin: 4, want: false, wantEmpty: 4},
		{name: "no spin", spin: 0, push: []verbs.WorkCompletion{proofWC}, want: false, wantQueued: 1},
		{name: "failed first", spin: 4, failed: true, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, cq, _ := pollingConn(t, tc.spin)
			copy(c.proofSlot, "hello")
			cq.push(tc.push...)
			if tc.failed {
				c.mu.Lock()
				c.failLocked(ErrQPFailed)
				c.mu.Unlock()
			}
			require.Equal(t, tc.want, c.SpinProof(), "SpinProof with spin %d, %d completions queued", tc.spin, len(tc.push))
			require.Equal(t, tc.wantEmpty, c.poll.emptied.Load(), "empty polls")
			require.Len(t, cq.queue, tc.wantQueued, "completions left in the CQ")
			require.Zero(t, c.poll.spinners.Load(), "spinning waiters after SpinProof")
			if tc.want && !tc.failed {
				p, err := c.Proof()
				require.NoError(t, err)
				require.Equal(t, "hello", string(p))
			}
		})
	}
}

// TestProofDoneMadeOnDemand: ProofDone's channel is made by its first call, closed
// whether the call comes before or after the wait ends (the proof or a failure), and
// never made by a wait that ended without it.
func TestProofDoneMadeOnDemand(t *testing.T) {
	const proofRecvID = recvWRFlag | proofRecvIndex
	arrive := &verbs.WorkCompletion{WRID: proofRecvID, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: 5}
	fail := &verbs.WorkCompletion{WRID: 0, Status: verbs.WCRetryExcErr, Opcode: verbs.WCSend}
	tests := []struct {
		name   string
		end    *verbs.WorkCompletion
		before bool // ProofDone is called before the wait ends, else after
	}{
		{"proof, asked before", arrive, true},
		{"proof, asked after", arrive, false},
		{"failure, asked before", fail, true},
		{"failure, asked after", fail, false},
	}
	isClosed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeConn(t, &fakeQP{})
			copy(c.proofSlot, "hello")
			var done <-chan struct{}
			if tt.before {
				done = c.ProofDone()
				require.False(t, isClosed(done), "ProofDone closed before the wait ended")
			}
			c.onCompletion(tt.end)
			require.True(t, c.proofOver(), "the wait is over after %v", tt.end.Status)
			if !tt.before {
				c.mu.Lock()
				made := c.proof.done != nil
				c.mu.Unlock()
				require.False(t, made, "a channel made with nobody asking for it")
				done = c.ProofDone()
			}
			require.True(t, isClosed(done), "ProofDone open after the wait ended")
			require.Equal(t, done, c.ProofDone(), "ProofDone's channel, asked again")
		})
	}
}

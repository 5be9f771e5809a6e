package rdma

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
)

// fakeQP is a queuePair that records what a Conn posts, so that the send and receive
// paths can be driven without a provider: the test plays the device, handing the Conn
// completions through onCompletion.
type fakeQP struct {
	mu      sync.Mutex
	sends   []verbs.SendWR // copies of every posted send WR, SGLs included
	recvs   []verbs.RecvWR
	toError int
	postErr error // PostSend and PostRecv fail with it when set
	qpn     uint32
}

func (q *fakeQP) PostSend(wrs []verbs.SendWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.postErr != nil {
		return q.postErr
	}
	for _, wr := range wrs {
		wr.SGL = append([]verbs.SGE(nil), wr.SGL...)
		q.sends = append(q.sends, wr)
	}
	return nil
}

func (q *fakeQP) PostRecv(wrs []verbs.RecvWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.postErr != nil {
		return q.postErr
	}
	q.recvs = append(q.recvs, wrs...)
	return nil
}

func (q *fakeQP) QPN() uint32 { return q.qpn }

func (q *fakeQP) ToError() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.toError++
	return nil
}

// posted returns a copy of the send WRs posted so far.
func (q *fakeQP) posted() []verbs.SendWR {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]verbs.SendWR(nil), q.sends...)
}

// Geometry of the fake connection.
const (
	fakeRing      = 64 << 10
	fakeWQEs      = 64
	fakeSQDepth   = 8
	fakeStage     = 16 << 10
	fakeStageAddr = 0x10000
	fakeStageKey  = 3
	fakePeerRing  = 0x200000
	fakePeerRKey  = 7
)

// newFakeConn returns a Conn over q as Connect would build it, without an Endpoint: no
// poller, no registered memory, nothing started. It is for the send, receive and
// completion paths only; Close needs the Endpoint.
func newFakeConn(t *testing.T, q *fakeQP) *Conn {
	t.Helper()
	params := flowctl.Params{RingSize: fakeRing, RecvWQEs: fakeWQEs}
	fc, err := flowctl.MakeEndpoint(params, params)
	require.NoError(t, err)
	ctrl, peer := net.Pipe()
	t.Cleanup(func() { ctrl.Close(); peer.Close() })
	c := &Conn{
		qp:           q,
		ctrl:         ctrl,
		fc:           fc,
		peerRingAddr: fakePeerRing,
		peerRKey:     fakePeerRKey,
		sqDepth:      fakeSQDepth,
		signalEvery:  fakeSQDepth / 4,
		stageEnd:     make([]uint64, fakeSQDepth),
		stage:        make([]byte, fakeStage),
		stageKey:     fakeStageKey,
		stageAddr:    fakeStageAddr,
		maxChunk:     fakeStage / 4,
		ring:         make([]byte, fakeRing),
		proofSlot:    make([]byte, ProofMaxLen),
		spillMax:     fakeRing,
	}
	return c
}

// staged returns the staging bytes an SGE of c points at.
func staged(c *Conn, s verbs.SGE) []byte {
	off := int(s.Addr - c.stageAddr)
	return c.stage[off : off+int(s.Length)]
}

// connErr returns c's sticky error.
func connErr(c *Conn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// closableFakeConn is newFakeConn with an Endpoint that holds only a poller (no device,
// QP or memory): Close and Abandon then run their drain and teardown against the fake,
// and the endpoint's release frees nothing but the poller reservation. linger is the
// Conn's Options.Linger.
func closableFakeConn(t *testing.T, q *fakeQP, linger time.Duration) *Conn {
	t.Helper()
	c := newFakeConn(t, q)
	c.ep = &Endpoint{poller: newFakePoller(newFakeCQ(), 64, 0)}
	c.poll = c.ep.poller
	c.linger = linger
	return c
}

// released reports whether c's endpoint has been released (release drops the poller).
func released(c *Conn) bool { return c.ep.poller == nil }

// toErrors returns how often the QP was moved to ERROR.
func (q *fakeQP) toErrors() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.toError
}

// reposted returns a copy of the receive WRs posted so far.
func (q *fakeQP) reposted() []verbs.RecvWR {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]verbs.RecvWR(nil), q.recvs...)
}

// postedKinds returns the message kind of each send WR posted so far.
func postedKinds(t *testing.T, q *fakeQP) []flowctl.Kind {
	t.Helper()
	var kinds []flowctl.Kind
	for _, wr := range q.posted() {
		var n uint32
		if len(wr.SGL) > 0 {
			n = wr.SGL[0].Length
		}
		m, err := flowctl.DecodeImm(wr.Imm, n)
		require.NoError(t, err)
		kinds = append(kinds, m.Kind)
	}
	return kinds
}

// sendDone is the successful completion of the signaled send WR id.
func sendDone(id uint64) *verbs.WorkCompletion {
	return &verbs.WorkCompletion{WRID: id, Status: verbs.WCSuccess, Opcode: verbs.WCRDMAWrite}
}

package rdma

import (
	"bytes"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
	"github.com/rsockio/rsock/verbs/soft"
)

// This file proves the isolation between connections (package docs, "Isolation"): a
// peer that knows another connection's ring address and rkey cannot write into it.

// testProvider is a provider a test runs on, with its soft fabric for the release
// check (nil on a device).
type testProvider struct {
	name string
	p    verbs.Provider
	f    *soft.Fabric
}

// providersUnderTest returns soft and, where this build has one and the machine a device
// holding 127.0.0.1 (built with -tags rdma, in the Soft-RoCE VM), the default provider.
func providersUnderTest(t *testing.T) []testProvider {
	f := soft.New(soft.Options{})
	out := []testProvider{{"soft", f, f}}
	if p, err := auto.Default(); err == nil {
		out = append(out, testProvider{"default-" + p.Name(), p, nil})
	} else {
		t.Logf("no default provider here, soft only: %v", err)
	}
	return out
}

// rogue is a peer that runs no rsock engine: a raw QP on a context, protection domain
// and CQ of its own, connected to an rsock endpoint as a client is after the hello, and
// then used to post whatever it likes.
type rogue struct {
	ep  Endpoint // qp, path and psn only, for connectQP
	ctx verbs.Context
	pd  verbs.PD
	cq  verbs.CQ
	mr  verbs.MR
}

const rogueWQEs = 16

// newRogue creates a rogue peer on the device of p that serves 127.0.0.1. Everything it
// holds is destroyed when the test ends.
func newRogue(t *testing.T, p verbs.Provider) *rogue {
	devs, err := p.Devices()
	require.NoError(t, err)
	chosen, err := verbs.Selector{}.Select(devs, loopback)
	require.NoError(t, err)
	r := &rogue{}
	r.ep.path, r.ep.psn = portPath{port: chosen.Port, gid: chosen.GID}, 0x1234
	r.ctx, err = p.Open(chosen.Device.Name)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{r.ep.qp, r.mr, r.cq, r.pd, r.ctx} {
			if c != nil {
				require.NoError(t, c.Close())
			}
		}
	})
	r.pd, err = r.ctx.AllocPD()
	require.NoError(t, err)
	r.cq, err = r.ctx.CreateCQ(64, nil, 0)
	require.NoError(t, err)
	r.mr, err = r.pd.RegMR(rogueRegion, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	r.ep.qp, err = r.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Caps: verbs.QPCaps{
		MaxSendWR: 8, MaxRecvWR: rogueWQEs, MaxSendSGE: 1, MaxRecvSGE: 1,
	}})
	require.NoError(t, err)
	require.NoError(t, r.ep.qp.ToInit(verbs.InitAttr{Port: r.ep.path.port.Num, Access: verbs.AccessRemoteWrite}))
	for i := range rogueWQEs {
		require.NoError(t, r.ep.qp.PostRecv([]verbs.RecvWR{{ID: recvWRFlag | uint64(i)}}))
	}
	return r
}

// rogueRegion is the size of the rogue's region: the largest ring the tests attack.
const rogueRegion = 64 << 10

// offer is what the rogue sends in its hello.
func (r *rogue) offer() Offer {
	return Offer{
		GID: r.ep.path.gid.GID, LID: r.ep.path.port.LID, MTU: r.ep.path.port.ActiveMTU,
		QPN: r.ep.qp.QPN(), PSN: r.ep.psn,
		RingAddr: r.mr.Addr(), RingRKey: r.mr.RKey(), RingSize: uint32(len(r.mr.Bytes())),
		RecvWQEs: rogueWQEs,
	}
}

// waitSend polls the rogue's CQ for the completion of send WR id, skipping receive
// completions, and returns it. Completions arrive in real time on a device, so it polls
// until one comes, failing the test after a generous bound.
func (r *rogue) waitSend(t *testing.T, id uint64) verbs.WorkCompletion {
	var wcs [8]verbs.WorkCompletion
	limit := time.Now().Add(20 * time.Second)
	for {
		n, err := r.cq.Poll(wcs[:])
		require.NoError(t, err)
		for _, wc := range wcs[:n] {
			if wc.WRID == id {
				return wc
			}
		}
		if n == 0 {
			require.False(t, time.Now().After(limit), "no completion of the rogue's WR %d", id)
			runtime.Gosched()
		}
	}
}

// waitArrived waits until n bytes have arrived at c, and requires that they are still
// in its ring (not spilled), where a write into the ring would reach them.
func waitArrived(t *testing.T, c *Conn, n int) {
	limit := time.Now().Add(20 * time.Second)
	for {
		c.mu.Lock()
		buffered, spilled := c.fc.Buffered(), c.spilled
		c.mu.Unlock()
		if buffered+int(spilled) >= n {
			require.Zero(t, spilled, "the bytes left the ring: the test would not see a write into it")
			return
		}
		require.False(t, time.Now().After(limit), "%d of %d bytes arrived", buffered, n)
		runtime.Gosched()
	}
}

// TestFaultCrossConnectionWrite: a peer learns (or guesses) the ring address and rkey of
// another connection on the same device and posts an RDMA write into it over its own
// QP. The write must fail at the peer with a remote access error, the connection it was
// posted on must fail (its responder QP goes to ERROR, as rxe's does), and the other
// connection must not notice: the bytes resting in its ring when the write struck, and
// a verified stream both ways after it, arrive intact.
//
// It runs on soft and, in the Soft-RoCE VM, on the kernel's rxe: both refuse an rkey of
// a region outside the responder QP's protection domain, and each connection has its own.
func TestFaultCrossConnectionWrite(t *testing.T) {
	ops := []struct {
		name string
		op   verbs.Opcode
	}{
		{"Write", verbs.OpRDMAWrite},
		{"WriteWithImm", verbs.OpRDMAWriteWithImm},
	}
	for _, pv := range providersUnderTest(t) {
		for _, tc := range ops {
			t.Run(pv.name+"/"+tc.name, func(t *testing.T) {
				if pv.f != nil {
					// Registered first, so it runs after the rogue's cleanup.
					t.Cleanup(func() { requireReleased(t, pv.f) })
				}
				crossConnectionWrite(t, pv.p, tc.op)
			})
		}
	}
}

func crossConnectionWrite(t *testing.T, p verbs.Provider, op verbs.Opcode) {
	opts := Options{RingSize: 16 << 10, SendBufferSize: 16 << 10}
	x, y := connPair(t, p, opts) // the victim connection

	// The rogue's own connection: it talks to an rsock endpoint, b.
	r := newRogue(t, p)
	eb, err := Prepare(p, loopback, opts)
	require.NoError(t, err)
	ctrlR, ctrlB := tcpPair(t)
	defer ctrlR.Close()
	b, err := eb.Connect(r.offer(), ctrlB, 0)
	if err != nil {
		eb.Abort()
		require.NoError(t, err)
	}
	b.Start()
	defer b.Close()
	require.NoError(t, r.ep.connectQP(eb.Offer()))

	// Bytes rest unread in y's ring.
	resting := make([]byte, 2<<10)
	rand.NewChaCha8(seedBytes(7)).Read(resting)
	_, err = x.Write(resting)
	require.NoError(t, err)
	waitArrived(t, y, len(resting))

	// The rogue writes its whole region of 0xEE over y's ring, with y's rkey.
	victim := y.ep.Offer()
	attack := r.mr.Bytes()[:victim.RingSize]
	for i := range attack {
		attack[i] = 0xee
	}
	const attackID = 99
	require.NoError(t, r.ep.qp.PostSend([]verbs.SendWR{{
		ID: attackID, Opcode: op, Flags: verbs.SendSignaled, Imm: 0x12345678,
		SGL:        []verbs.SGE{{Addr: r.mr.Addr(), Length: victim.RingSize, LKey: r.mr.LKey()}},
		RemoteAddr: victim.RingAddr, RKey: victim.RingRKey,
	}}))
	wc := r.waitSend(t, attackID)
	require.Equal(t, verbs.WCRemAccessErr, wc.Status, "the rogue's write into another connection's ring: %+v", wc)

	// The connection the write came in on fails; its application learns why.
	readErr := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 1))
		readErr <- err
	}()
	select {
	case err := <-readErr:
		require.ErrorIs(t, err, ErrQPFailed, "the rogue's own connection")
	case <-time.After(20 * time.Second):
		t.Fatal("the connection the rogue attacked from did not fail")
	}

	// The victim connection saw nothing: its resting bytes, then a stream both ways.
	got := make([]byte, len(resting))
	_, err = io.ReadFull(y, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(resting, got), "bytes resting in the victim's ring changed")
	done := make(chan direction)
	go func() { done <- verifiedStream(t, y, x, 3, 1<<20, nil) }()
	xy := verifiedStream(t, x, y, 4, 1<<20, nil)
	yx := <-done
	for _, d := range []direction{xy, yx} {
		require.NoError(t, d.writeErr, "victim write")
		require.ErrorIs(t, d.readErr, io.EOF, "victim read")
		require.Equal(t, d.written, d.read, "victim bytes")
	}
	require.NoError(t, x.Close())
	require.NoError(t, y.Close())
}

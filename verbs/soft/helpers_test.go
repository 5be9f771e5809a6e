package soft_test

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// side is one end of a connection made by connectPair.
type side struct {
	ctx      verbs.Context
	pd       verbs.PD
	scq, rcq verbs.CQ
	qp       verbs.QP
	mr       verbs.MR
	gid      verbs.GID
	psn      uint32
}

// pairOpts configure connectPair; zero fields take the defaults noted.
type pairOpts struct {
	devA, devB string       // "soft0", and "soft1" if the fabric has it
	caps       verbs.QPCaps // 16 WRs each way, 2 SGEs, 64 bytes inline
	cqe        int          // 64
	signalAll  bool
	rnrRetry   uint8 // 7 unless exactRNR
	exactRNR   bool  // use rnrRetry as given, 0 included
	rnrTimer   uint8 // 1
	timeout    uint8 // 14
	retry      uint8 // 3
	// infiniteTimeout sets the ACK timeout to 0: wait forever.
	infiniteTimeout bool
	mrSize          int // 64 KiB
}

func (o *pairOpts) defaults(f *soft.Fabric) {
	devs, _ := f.Devices()
	if o.devA == "" {
		o.devA = devs[0].Name
	}
	if o.devB == "" {
		o.devB = devs[len(devs)-1].Name
	}
	if o.caps == (verbs.QPCaps{}) {
		o.caps = verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}
	}
	if o.cqe == 0 {
		o.cqe = 64
	}
	if o.rnrRetry == 0 && !o.exactRNR {
		o.rnrRetry = 7
	}
	if o.rnrTimer == 0 {
		o.rnrTimer = 1
	}
	if o.timeout == 0 && !o.infiniteTimeout {
		o.timeout = 14
	}
	if o.retry == 0 {
		o.retry = 3
	}
	if o.mrSize == 0 {
		o.mrSize = 1 << 16
	}
}

const access = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

// newSide creates the resources of one side on device dev, destroyed when the test ends.
func newSide(t *testing.T, f *soft.Fabric, dev string, o pairOpts, psn uint32) *side {
	t.Helper()
	s := &side{psn: psn}
	var err error
	s.ctx, err = f.Open(dev)
	require.NoError(t, err)
	s.gid = s.ctx.Device().Ports[0].GIDs[1].GID
	s.pd, err = s.ctx.AllocPD()
	require.NoError(t, err)
	s.scq, err = s.ctx.CreateCQ(o.cqe, nil, 0)
	require.NoError(t, err)
	s.rcq, err = s.ctx.CreateCQ(o.cqe, nil, 0)
	require.NoError(t, err)
	s.mr, err = s.pd.RegMR(o.mrSize, access)
	require.NoError(t, err)
	s.qp, err = s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, Caps: o.caps, SignalAll: o.signalAll})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := s.qp.Close(); !errors.Is(err, verbs.ErrClosed) { // a test may have closed it
			require.NoError(t, err)
		}
		for _, c := range []interface{ Close() error }{s.mr, s.scq, s.rcq, s.pd, s.ctx} {
			require.NoError(t, c.Close())
		}
	})
	return s
}

func rtr(s, peer *side, o pairOpts) verbs.RTRAttr {
	return verbs.RTRAttr{
		PathMTU: verbs.MTU4096, DestQPN: peer.qp.QPN(), RQPSN: peer.psn,
		Dest:        verbs.AddressVector{Port: 1, IsGlobal: true, DestGID: peer.gid, SGIDIndex: 1, HopLimit: 64},
		MinRNRTimer: o.rnrTimer,
	}
}

func rts(s *side, o pairOpts) verbs.RTSAttr {
	return verbs.RTSAttr{SQPSN: s.psn, Timeout: o.timeout, RetryCount: o.retry, RNRRetry: o.rnrRetry}
}

// connectPair returns two sides connected to each other, in RTS.
func connectPair(t *testing.T, f *soft.Fabric, o pairOpts) (a, b *side) {
	t.Helper()
	o.defaults(f)
	a = newSide(t, f, o.devA, o, 0x1000)
	b = newSide(t, f, o.devB, o, 0x2000)
	for _, s := range []*side{a, b} {
		require.NoError(t, s.qp.ToInit(verbs.InitAttr{Port: 1, Access: access}))
	}
	require.NoError(t, a.qp.ToRTR(rtr(a, b, o)))
	require.NoError(t, b.qp.ToRTR(rtr(b, a, o)))
	require.NoError(t, a.qp.ToRTS(rts(a, o)))
	require.NoError(t, b.qp.ToRTS(rts(b, o)))
	return a, b
}

func sge(m verbs.MR, off, n int) verbs.SGE {
	return verbs.SGE{Addr: m.Addr() + uint64(off), Length: uint32(n), LKey: m.LKey()}
}

// writeImm is a signaled RDMA WRITE_WITH_IMM of n bytes from a to the same offset of b.
func writeImm(id uint64, a, b verbs.MR, off, n int) verbs.SendWR {
	return verbs.SendWR{
		ID: id, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: uint32(id),
		SGL: []verbs.SGE{sge(a, off, n)}, RemoteAddr: b.Addr() + uint64(off), RKey: b.RKey(),
	}
}

// poll waits for n completions of cq.
func poll(t *testing.T, cq verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	out := make([]verbs.WorkCompletion, 0, n)
	var buf [16]verbs.WorkCompletion
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		require.NoError(t, err)
		out = append(out, buf[:k]...)
		if k == 0 {
			require.False(t, time.Now().After(deadline), "waited for %d completions, got %v", n, out)
			runtime.Gosched()
			// Paces the poll for completions that must come; most soft tests run on
			// real time (and in a synctest bubble this sleep moves the fake clock).
			time.Sleep(10 * time.Microsecond)
		}
	}
	return out
}

func requireEmpty(t *testing.T, cq verbs.CQ) {
	t.Helper()
	var buf [4]verbs.WorkCompletion
	n, err := cq.Poll(buf[:])
	require.NoError(t, err)
	require.Zero(t, n, "completions: %v", buf[:n])
}

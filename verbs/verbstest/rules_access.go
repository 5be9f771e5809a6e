package verbstest

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// remoteAccessCase is a remote access that must fail with REM_ACCESS_ERR.
type remoteAccessCase struct {
	name string
	// setup adjusts the configurations of requester and responder.
	setup func(a, b *config)
	// wr builds the offending request; it may register regions on either side.
	wr func(t *testing.T, a, b *endpoint) verbs.SendWR
}

// runRemoteAccess checks that each case completes with REM_ACCESS_ERR, moves both QPs to
// ERROR (the responder's receive WQE is flushed) and leaves the target memory untouched.
func runRemoteAccess(t *testing.T, p verbs.Provider, cases []remoteAccessCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			acfg, bcfg := defaults(), defaults()
			if tc.setup != nil {
				tc.setup(&acfg, &bcfg)
			}
			a, b := newPair(t, p, acfg, bcfg)
			postRecvs(t, b.qp, 40, 1)
			fill(a.mr.Bytes()[:4096], 5)
			before := bytes.Clone(b.mr.Bytes())
			post(t, a.qp, tc.wr(t, a, b), writeWR(2, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled))
			wcs := pollN(t, a.scq, 2)
			requireWC(t, wcs[0], 1, verbs.WCRemAccessErr)
			requireWC(t, wcs[1], 2, verbs.WCWRFlushErr)
			waitState(t, a.qp, verbs.QPStateError)
			waitState(t, b.qp, verbs.QPStateError)
			requireWC(t, pollOne(t, b.rcq), 40, verbs.WCWRFlushErr)
			require.True(t, bytes.Equal(before, b.mr.Bytes()), "target region changed by a refused access")
		})
	}
}

// testRemoteAccessBadRKey: an rkey that names no region of the responder's PD is refused.
func testRemoteAccessBadRKey(t *testing.T, p verbs.Provider) {
	runRemoteAccess(t, p, []remoteAccessCase{
		{name: "Deregistered", wr: func(t *testing.T, a, b *endpoint) verbs.SendWR {
			m, err := b.pd.RegMR(4096, allAccess)
			require.NoError(t, err)
			wr := writeWR(1, a.mr, 0, 64, m, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
			require.NoError(t, m.Close())
			return wr
		}},
		{name: "DeregisteredWithImm", wr: func(t *testing.T, a, b *endpoint) verbs.SendWR {
			m, err := b.pd.RegMR(4096, allAccess)
			require.NoError(t, err)
			wr := writeWR(1, a.mr, 0, 64, m, 0, verbs.OpRDMAWriteWithImm, verbs.SendSignaled)
			require.NoError(t, m.Close())
			return wr
		}},
		{name: "OtherPD", wr: func(t *testing.T, a, b *endpoint) verbs.SendWR {
			pd, err := b.ctx.AllocPD()
			require.NoError(t, err)
			m, err := pd.RegMR(4096, allAccess)
			require.NoError(t, err)
			t.Cleanup(func() {
				require.NoError(t, m.Close())
				require.NoError(t, pd.Close())
			})
			return writeWR(1, a.mr, 0, 64, m, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
		}},
	})
}

// testRemoteAccessBounds: every byte of a remote access must lie inside the region.
func testRemoteAccessBounds(t *testing.T, p verbs.Provider) {
	runRemoteAccess(t, p, []remoteAccessCase{
		{name: "WritePastEnd", wr: func(t *testing.T, a, b *endpoint) verbs.SendWR {
			return writeWR(1, a.mr, 0, 64, b.mr, len(b.mr.Bytes())-32, verbs.OpRDMAWrite, verbs.SendSignaled)
		}},
		{name: "WriteBeforeStart", wr: func(t *testing.T, a, b *endpoint) verbs.SendWR {
			wr := writeWR(1, a.mr, 0, 64, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
			wr.RemoteAddr -= 16
			return wr
		}},
		{name: "WriteWithImmPastEnd", wr: func(t *testing.T, a, b *endpoint) verbs.SendWR {
			return writeWR(1, a.mr, 0, 64, b.mr, len(b.mr.Bytes())-1, verbs.OpRDMAWriteWithImm, verbs.SendSignaled)
		}},
		{name: "ReadPastEnd", wr: func(t *testing.T, a, b *endpoint) verbs.SendWR {
			wr := writeWR(1, a.mr, 0, 64, b.mr, len(b.mr.Bytes())-63, verbs.OpRDMARead, verbs.SendSignaled)
			return wr
		}},
	})
}

// testRemoteAccessFlags: a remote write needs remote write access on both the target
// region and the responder QP; a remote read needs remote read access on both.
func testRemoteAccessFlags(t *testing.T, p verbs.Provider) {
	otherRegion := func(access verbs.AccessFlags, op verbs.Opcode) func(t *testing.T, a, b *endpoint) verbs.SendWR {
		return func(t *testing.T, a, b *endpoint) verbs.SendWR {
			return writeWR(1, a.mr, 0, 64, b.regMR(4096, access), 0, op, verbs.SendSignaled)
		}
	}
	ownRegion := func(op verbs.Opcode) func(t *testing.T, a, b *endpoint) verbs.SendWR {
		return func(t *testing.T, a, b *endpoint) verbs.SendWR {
			return writeWR(1, a.mr, 0, 64, b.mr, 0, op, verbs.SendSignaled)
		}
	}
	runRemoteAccess(t, p, []remoteAccessCase{
		{name: "WriteRegionLocalOnly", wr: otherRegion(verbs.AccessLocalWrite, verbs.OpRDMAWrite)},
		{name: "WriteRegionReadOnly", wr: otherRegion(verbs.AccessLocalWrite|verbs.AccessRemoteRead, verbs.OpRDMAWrite)},
		{name: "WriteWithImmRegionReadOnly", wr: otherRegion(verbs.AccessLocalWrite|verbs.AccessRemoteRead, verbs.OpRDMAWriteWithImm)},
		{name: "ReadRegionWriteOnly", wr: otherRegion(verbs.AccessLocalWrite|verbs.AccessRemoteWrite, verbs.OpRDMARead)},
		{
			name:  "WriteQPReadOnly",
			setup: func(a, b *config) { b.qpAccess = verbs.AccessLocalWrite | verbs.AccessRemoteRead },
			wr:    ownRegion(verbs.OpRDMAWrite),
		},
		{
			name:  "ReadQPWriteOnly",
			setup: func(a, b *config) { b.qpAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite },
			wr:    ownRegion(verbs.OpRDMARead),
		},
	})
}

// testSendLongerThanRecvBuffer: a SEND longer than the receive WQE's buffers fails:
// REM_INV_REQ_ERR at the requester, LOC_LEN_ERR on the receive, both QPs in ERROR.
func testSendLongerThanRecvBuffer(t *testing.T, p verbs.Provider) {
	a, b := newPair(t, p, defaults())
	postRecv(t, b.qp, verbs.RecvWR{ID: 8, SGL: []verbs.SGE{sge(b.mr, 0, 16), sge(b.mr, 100, 16)}})
	postRecvs(t, b.qp, 9, 1)
	post(t, a.qp, sendWR(1, a.mr, 0, 33, verbs.SendSignaled))
	requireWC(t, pollOne(t, a.scq), 1, verbs.WCRemInvReqErr)
	wcs := pollN(t, b.rcq, 2)
	requireWC(t, wcs[0], 8, verbs.WCLocLenErr)
	requireWC(t, wcs[1], 9, verbs.WCWRFlushErr)
	waitState(t, a.qp, verbs.QPStateError)
	waitState(t, b.qp, verbs.QPStateError)

	// Exactly the buffers' size fits.
	c, d := newPair(t, p, defaults())
	postRecv(t, d.qp, verbs.RecvWR{ID: 8, SGL: []verbs.SGE{sge(d.mr, 0, 16), sge(d.mr, 100, 16)}})
	fill(c.mr.Bytes()[:32], 2)
	post(t, c.qp, sendWR(1, c.mr, 0, 32, verbs.SendSignaled))
	requireWC(t, pollOne(t, c.scq), 1, verbs.WCSuccess)
	wc := pollOne(t, d.rcq)
	requireWC(t, wc, 8, verbs.WCSuccess)
	require.Equal(t, uint32(32), wc.ByteLen)
	require.Equal(t, c.mr.Bytes()[:16], d.mr.Bytes()[:16])
	require.Equal(t, c.mr.Bytes()[16:32], d.mr.Bytes()[100:116])
}

// testLocalProtection: a local SGE that names no region of the QP's PD, strays outside its
// region, or (for RDMA READ) lacks local write access completes with LOC_PROT_ERR and
// moves the requester alone to ERROR.
func testLocalProtection(t *testing.T, p verbs.Provider) {
	cases := []struct {
		name string
		wr   func(t *testing.T, a, b *endpoint) verbs.SendWR
	}{
		{"DeregisteredKey", func(t *testing.T, a, b *endpoint) verbs.SendWR {
			m, err := a.pd.RegMR(4096, allAccess)
			require.NoError(t, err)
			wr := writeWR(1, m, 0, 64, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
			require.NoError(t, m.Close())
			return wr
		}},
		{"PastEnd", func(t *testing.T, a, b *endpoint) verbs.SendWR {
			return writeWR(1, a.mr, len(a.mr.Bytes())-8, 64, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
		}},
		{"ReadIntoReadOnly", func(t *testing.T, a, b *endpoint) verbs.SendWR {
			m := a.regMR(4096, 0)
			return writeWR(1, m, 0, 64, b.mr, 0, verbs.OpRDMARead, verbs.SendSignaled)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newPair(t, p, defaults())
			post(t, a.qp, tc.wr(t, a, b))
			requireWC(t, pollOne(t, a.scq), 1, verbs.WCLocProtErr)
			waitState(t, a.qp, verbs.QPStateError)
			require.Equal(t, verbs.QPStateRTS, b.qp.State(), "responder of a request that never left")
		})
	}
}

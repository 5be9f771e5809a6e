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
	// qpAccess marks a request the responder QP's access flags forbid (rather than
	// the region's rkey, bounds or rights).
	qpAccess bool
}

// runRemoteAccess checks that each case fails at the requester, moves both QPs to ERROR,
// completes the responder's receive WQE in error and leaves the target memory untouched.
//
// Where real devices legitimately differ, the rule accepts each status the verbs contract
// allows:
//   - A request the responder QP's access flags forbid may be NAKed as a remote access
//     error or as an invalid request (IBA 9.7.5.2.2 lists an operation the QP is not
//     enabled for among invalid requests; rxe answers REM_INV_REQ_ERR, soft
//     REM_ACCESS_ERR).
//   - An RDMA WRITE_WITH_IMM consumes the responder's receive WQE when it arrives, so that
//     WQE completes either flushed (soft) or with the error that ended the QP (rxe:
//     REM_ACCESS_ERR). A WQE no request consumed is always flushed.
func runRemoteAccess(t *testing.T, p providers, cases []remoteAccessCase) {
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
			wr := tc.wr(t, a, b)
			post(t, a.qp, wr, writeWR(2, a.mr, 0, 8, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled))
			wcs := pollN(t, a.scq, 2)
			if tc.qpAccess {
				requireWCIn(t, wcs[0], 1, verbs.WCRemAccessErr, verbs.WCRemInvReqErr)
			} else {
				requireWC(t, wcs[0], 1, verbs.WCRemAccessErr)
			}
			requireWC(t, wcs[1], 2, verbs.WCWRFlushErr)
			waitState(t, a.qp, verbs.QPStateError)
			waitState(t, b.qp, verbs.QPStateError)
			if wr.Opcode == verbs.OpRDMAWriteWithImm {
				requireWCIn(t, pollOne(t, b.rcq), 40, verbs.WCWRFlushErr, verbs.WCRemAccessErr)
			} else {
				requireWC(t, pollOne(t, b.rcq), 40, verbs.WCWRFlushErr)
			}
			require.True(t, bytes.Equal(before, b.mr.Bytes()), "target region changed by a refused access")
		})
	}
}

// testRemoteAccessBadRKey: an rkey that names no region of the responder's PD is refused.
func testRemoteAccessBadRKey(t *testing.T, p providers) {
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
func testRemoteAccessBounds(t *testing.T, p providers) {
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
func testRemoteAccessFlags(t *testing.T, p providers) {
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
			name:     "WriteQPReadOnly",
			setup:    func(a, b *config) { b.qpAccess = verbs.AccessLocalWrite | verbs.AccessRemoteRead },
			wr:       ownRegion(verbs.OpRDMAWrite),
			qpAccess: true,
		},
		{
			name:     "ReadQPWriteOnly",
			setup:    func(a, b *config) { b.qpAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite },
			wr:       ownRegion(verbs.OpRDMARead),
			qpAccess: true,
		},
	})
}

// testSendLongerThanRecvBuffer: a SEND longer than the receive WQE's buffers fails: the
// receive completes with a local error, the requester with an error NAK, both QPs go to
// ERROR. ibv_poll_cq(3) names LOC_LEN_ERR for a receive buffer too small for the message,
// and the IBA makes the NAK an invalid request (REM_INV_REQ_ERR); soft reports those. rxe
// (kernels 6.1 and 6.12) reports LOC_QP_OP_ERR on the receive and REM_OP_ERR ("the
// responder could not complete the operation") at the requester. What a consumer relies on
// (both sides fail, nothing is delivered as a success, both QPs in ERROR) holds with
// either, so the rule accepts both pairs of statuses.
func testSendLongerThanRecvBuffer(t *testing.T, p providers) {
	a, b := newPair(t, p, defaults())
	postRecv(t, b.qp, verbs.RecvWR{ID: 8, SGL: []verbs.SGE{sge(b.mr, 0, 16), sge(b.mr, 100, 16)}})
	postRecvs(t, b.qp, 9, 1)
	post(t, a.qp, sendWR(1, a.mr, 0, 33, verbs.SendSignaled))
	requireWCIn(t, pollOne(t, a.scq), 1, verbs.WCRemInvReqErr, verbs.WCRemOpErr)
	wcs := pollN(t, b.rcq, 2)
	requireWCIn(t, wcs[0], 8, verbs.WCLocLenErr, verbs.WCLocQPOpErr)
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
// region, or (for RDMA READ) lacks local write access fails, moves the requester alone to
// ERROR and leaves the responder's memory untouched. The status is LOC_PROT_ERR, except
// where the local key check itself fails (a key that names no region, an SGE past its
// region's end): rxe on kernel 6.1 reports LOC_QP_OP_ERR for a dead key, and 6.12 moves the
// QP to ERROR and completes the WR that failed the check with WR_FLUSH_ERR. What a consumer
// relies on (the WR fails, the QP goes to ERROR, nothing reaches the peer) holds on all of
// them, so the rule accepts those three statuses there.
func testLocalProtection(t *testing.T, p providers) {
	cases := []struct {
		name    string
		wr      func(t *testing.T, a, b *endpoint) verbs.SendWR
		allowed []verbs.WCStatus
	}{
		{"DeregisteredKey", func(t *testing.T, a, b *endpoint) verbs.SendWR {
			m, err := a.pd.RegMR(4096, allAccess)
			require.NoError(t, err)
			wr := writeWR(1, m, 0, 64, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
			require.NoError(t, m.Close())
			return wr
		}, []verbs.WCStatus{verbs.WCLocProtErr, verbs.WCLocQPOpErr, verbs.WCWRFlushErr}},
		{"PastEnd", func(t *testing.T, a, b *endpoint) verbs.SendWR {
			return writeWR(1, a.mr, len(a.mr.Bytes())-8, 64, b.mr, 0, verbs.OpRDMAWrite, verbs.SendSignaled)
		}, []verbs.WCStatus{verbs.WCLocProtErr, verbs.WCLocQPOpErr, verbs.WCWRFlushErr}},
		{"ReadIntoReadOnly", func(t *testing.T, a, b *endpoint) verbs.SendWR {
			m := a.regMR(4096, 0)
			return writeWR(1, m, 0, 64, b.mr, 0, verbs.OpRDMARead, verbs.SendSignaled)
		}, []verbs.WCStatus{verbs.WCLocProtErr}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newPair(t, p, defaults())
			before := bytes.Clone(b.mr.Bytes())
			post(t, a.qp, tc.wr(t, a, b))
			requireWCIn(t, pollOne(t, a.scq), 1, tc.allowed...)
			waitState(t, a.qp, verbs.QPStateError)
			require.True(t, bytes.Equal(before, b.mr.Bytes()), "responder memory changed by a failed request")
			require.Equal(t, verbs.QPStateRTS, b.qp.State(), "responder of a request that never left")
		})
	}
}

// testRemoteAccessOtherConnection: the isolation a process gets by giving each connection
// a protection domain of its own on one device context. Two connections, whose responder
// ends b1 and b2 share a context but not a PD: a request on the first that names the
// second's region, by its rkey and address, is refused as any rkey outside the responder
// QP's PD is (REM_ACCESS_ERR at the requester, both QPs of the first connection in
// ERROR, the receive WQE a WRITE_WITH_IMM consumed completed as in runRemoteAccess), the
// region is untouched, and the second connection carries on: its QPs stay in RTS and a
// WRITE_WITH_IMM on it lands. rxe looks the rkey up and compares the region's PD with the
// QP's; hardware does the same with its protection tables.
func testRemoteAccessOtherConnection(t *testing.T, p providers) {
	for _, op := range []verbs.Opcode{verbs.OpRDMAWrite, verbs.OpRDMAWriteWithImm} {
		name := map[verbs.Opcode]string{verbs.OpRDMAWrite: "Write", verbs.OpRDMAWriteWithImm: "WriteWithImm"}[op]
		t.Run(name, func(t *testing.T) {
			a1, b1 := newPair(t, p, defaults())
			a2 := newEndpoint(t, p, 0, "a2", defaults())
			b2 := newEndpointOn(t, b1, "b2", defaults())
			connect(a2, b2)
			postRecvs(t, b1.qp, 40, 1)
			postRecvs(t, b2.qp, 50, 1)
			fillMR(t, a1.mr, 0, 4096, 5)
			fillMR(t, a2.mr, 0, 4096, 6)
			before := readBytes(t, b2.mr, 0, 4096)

			post(t, a1.qp, writeWR(1, a1.mr, 0, 4096, b2.mr, 0, op, verbs.SendSignaled))
			requireWC(t, pollOne(t, a1.scq), 1, verbs.WCRemAccessErr)
			waitState(t, a1.qp, verbs.QPStateError)
			waitState(t, b1.qp, verbs.QPStateError)
			if op == verbs.OpRDMAWriteWithImm {
				requireWCIn(t, pollOne(t, b1.rcq), 40, verbs.WCWRFlushErr, verbs.WCRemAccessErr)
			} else {
				requireWC(t, pollOne(t, b1.rcq), 40, verbs.WCWRFlushErr)
			}
			require.Equal(t, before, readBytes(t, b2.mr, 0, 4096), "region of the other connection changed")

			require.Equal(t, verbs.QPStateRTS, b2.qp.State(), "the other connection's responder")
			require.Equal(t, verbs.QPStateRTS, a2.qp.State(), "the other connection's requester")
			requireEmpty(t, b2.rcq, "the other connection")
			post(t, a2.qp, writeWR(2, a2.mr, 0, 64, b2.mr, 128, verbs.OpRDMAWriteWithImm, verbs.SendSignaled))
			requireWC(t, pollOne(t, a2.scq), 2, verbs.WCSuccess)
			requireWC(t, pollOne(t, b2.rcq), 50, verbs.WCSuccess)
			require.Equal(t, readBytes(t, a2.mr, 0, 64), readBytes(t, b2.mr, 128, 64), "the other connection's write")
		})
	}
}

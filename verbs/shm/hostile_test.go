package shm

import (
	"crypto/rand"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
)

// fakeQP listens on the socket of a made-up QP and runs script on every connection a
// requester makes to it, after reading the requester's hello and first request. It
// returns the QP's number, and stops when the test ends.
func fakeQP(t *testing.T, script func(c *net.UnixConn)) uint32 {
	t.Helper()
	q := &QP{}
	ln, err := listenQP(q)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []*net.UnixConn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, maxMsg)
				for range 2 { // hello, then the first request or query
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
				script(c)
				for { // hold the connection until the requester drops it
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return q.qpn
}

// sealedMemfd returns a memfd of size bytes, sealed against shrinking if sealed.
func sealedMemfd(t *testing.T, size int, sealed bool) int {
	t.Helper()
	fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	if sealed {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
		require.NoError(t, err)
	}
	return fd
}

// TestHostileResponder: a responder that answers with garbage, or passes a region that
// could fault (unsealed, smaller than it claims, not a memfd), ends the requester's WR in
// RETRY_EXC_ERR and its QP in ERROR: a clean error, no crash, no hang.
func TestHostileResponder(t *testing.T) {
	region := func(size uint64) []byte {
		return (&msg{kind: msgRegion, ok: true, rkey: 1, access: 7, addr: 1 << 30, size: size}).encode(nil)
	}
	tests := []struct {
		name   string
		script func(t *testing.T, c *net.UnixConn)
	}{
		{"Garbage", func(t *testing.T, c *net.UnixConn) { c.Write([]byte{0xff, 1, 2, 3}) }},
		{"RegionWithoutDescriptor", func(t *testing.T, c *net.UnixConn) { c.Write(region(4096)) }},
		{"DescriptorWithResponse", func(t *testing.T, c *net.UnixConn) {
			fd := sealedMemfd(t, 4096, true)
			defer unix.Close(fd)
			c.WriteMsgUnix((&msg{kind: msgResponse, respKind: respAck}).encode(nil), unix.UnixRights(fd), nil)
		}},
		{"UnsealedRegion", func(t *testing.T, c *net.UnixConn) {
			fd := sealedMemfd(t, 4096, false)
			defer unix.Close(fd)
			c.WriteMsgUnix(region(4096), unix.UnixRights(fd), nil)
		}},
		{"RegionLargerThanMemfd", func(t *testing.T, c *net.UnixConn) {
			fd := sealedMemfd(t, 4096, true)
			defer unix.Close(fd)
			c.WriteMsgUnix(region(1<<20), unix.UnixRights(fd), nil)
		}},
		{"RegionThatIsAPipe", func(t *testing.T, c *net.UnixConn) {
			var p [2]int
			require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			c.WriteMsgUnix(region(4096), unix.UnixRights(p[0]), nil)
		}},
		{"TwoDescriptors", func(t *testing.T, c *net.UnixConn) {
			fd1, fd2 := sealedMemfd(t, 4096, true), sealedMemfd(t, 4096, true)
			defer unix.Close(fd1)
			defer unix.Close(fd2)
			c.WriteMsgUnix(region(4096), unix.UnixRights(fd1, fd2), nil)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider(t, 1)
			qpn := fakeQP(t, func(c *net.UnixConn) { tt.script(t, c) })
			a := newEnd(t, p, "shm0", 4096)
			a.link(t, a.gid, qpn, 8, 2) // ACK timeout about 1 ms, 2 retries
			wr := writeImm(1, a.mr, a.mr, 0, 64)
			wr.RKey = 1
			require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr}))
			wc := pollWait(t, a.cq, 1)[0]
			require.Equal(t, verbs.WCRetryExcErr, wc.Status, "completion %+v", wc)
			require.Equal(t, verbs.QPStateError, a.qp.State())
		})
	}
}

// TestHostileRequester: datagrams, channels and records that break the protocol end
// that connection only; the device keeps serving, and a request from a QP that is not
// the responder's peer is dropped.
func TestHostileRequester(t *testing.T) {
	p := newProvider(t, 2)
	a := newEnd(t, p, "shm0", 4096)
	b := newEnd(t, p, "shm1", 4096)
	connectEnds(t, a, b, 14, 3)
	hello := func(src, dst uint32) []byte {
		return (&msg{kind: msgHello, srcQPN: src, dstQPN: dst, srcGID: a.gid}).encode(nil)
	}
	aq, bq := a.qp.QPN(), b.qp.QPN()
	write := (&msg{kind: msgRequest, op: opWrite, rkey: b.mr.RKey(), length: 8, addr: b.mr.Addr()}).encode(nil)
	push := func(rec []byte) func(*testing.T, *channel) {
		return func(t *testing.T, ch *channel) {
			r := ch.requestRing()
			ok, _, err := r.push(rec, true)
			require.True(t, ok && err == nil, "push(%x) = %v, %v", rec, ok, err)
		}
	}
	tests := []struct {
		name    string
		send    [][]byte // datagrams; the first carries the channel if channel is set
		channel int      // 0: none; 1: a good channel; 2: unsealed; 3: too small
		records func(t *testing.T, ch *channel)
		answer  []byte // the response expected in the response ring; nil: the connection ends
	}{
		{"Garbage", [][]byte{{0xff}}, 0, nil, nil},
		{"RequestBeforeHello", [][]byte{write}, 0, nil, nil},
		{"HelloWithoutChannel", [][]byte{hello(aq, bq)}, 0, nil, nil},
		{"UnsealedChannel", [][]byte{hello(aq, bq)}, 2, nil, nil},
		{"SmallChannel", [][]byte{hello(aq, bq)}, 3, nil, nil},
		{"HelloForAnotherQP", [][]byte{hello(aq, bq^1)}, 1, push(write), nil},
		{"SecondHello", [][]byte{hello(aq, bq), hello(aq, bq)}, 1, nil, nil},
		{"RequestOnTheSocket", [][]byte{hello(aq, bq), write}, 1, nil, nil},
		{"GarbageRecord", [][]byte{hello(aq, bq)}, 1, push([]byte{0xff}), nil},
		{"TruncatedRequest", [][]byte{hello(aq, bq)}, 1, push(write[:10]), nil},
		{"CursorAhead", [][]byte{hello(aq, bq)}, 1, func(_ *testing.T, ch *channel) {
			atomic.StoreUint64(ch.word64(offReqProd), 1<<40)
		}, nil},
		{"RecordPastCursor", [][]byte{hello(aq, bq)}, 1, func(_ *testing.T, ch *channel) {
			le.PutUint32(ch.mem[chanHeader:], 4096)
			atomic.StoreUint64(ch.word64(offReqProd), 8)
		}, nil},
		{"NotItsPeer", [][]byte{hello(aq^1, bq)}, 1, push(write), (&msg{kind: msgResponse, respKind: respDrop}).encode(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: qpSocketName(bq), Net: "unixpacket"})
			require.NoError(t, err)
			defer c.Close()
			var ch *channel
			var fd int
			switch tt.channel {
			case 1:
				fd, ch = channelFD(t)
				// The test sleeps on the socket for its answer: the responder rings.
				atomic.StoreUint32(ch.word32(offReqSleep), 1)
			case 2:
				fd = sealedMemfd(t, chanSize, false)
				defer unix.Close(fd)
			case 3:
				fd = sealedMemfd(t, chanSize-4096, true)
				defer unix.Close(fd)
			}
			if ch != nil && tt.records != nil {
				tt.records(t, ch)
			}
			for i, d := range tt.send {
				var oob []byte
				if tt.channel != 0 && i == 0 {
					oob = unix.UnixRights(fd)
				}
				_, _, err := c.WriteMsgUnix(d, oob, nil)
				if tt.answer == nil && err != nil {
					return // closed already
				}
				require.NoError(t, err)
			}
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			if tt.answer == nil {
				require.Error(t, err, "the device answered %x instead of closing the connection", buf[:n])
				return
			}
			require.NoError(t, err)
			require.Equal(t, doorbell, buf[:n], "the responder's doorbell")
			r := ch.responseRing()
			got, err := r.pop(buf)
			require.NoError(t, err)
			require.Equal(t, tt.answer, got)
		})
	}

	// The device still serves its real peer.
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}}))
	copy(a.mr.Bytes(), "survived")
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(7, a.mr, b.mr, 0, 8)}))
	wcs := pollWait(t, a.cq, 1)
	require.Equal(t, verbs.WCSuccess, wcs[0].Status)
	require.Equal(t, "survived", string(b.mr.Bytes()[:8]))
}

// TestScribbledRegion: a peer that scribbles over every byte of a region it was given
// changes those bytes and nothing else: nothing but payload lives in shared memory, so
// the owner's QPs, CQs and other regions carry on.
func TestScribbledRegion(t *testing.T) {
	p := newProvider(t, 2)
	a := newEnd(t, p, "shm0", 1<<16)
	b := newEnd(t, p, "shm1", 1<<16)
	connectEnds(t, a, b, 14, 3)
	require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 1}, {ID: 2}}))
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(1, a.mr, b.mr, 0, 64)}))
	pollWait(t, a.cq, 1)

	// a's QP has b's region mapped now: scribble over all of it through that mapping.
	aq := a.qp.(*QP)
	aq.sq.mu.Lock()
	r := aq.sq.conn.region(b.mr.RKey())
	require.NotNil(t, r, "a's mapping of b's region")
	rand.Read(r.mem)
	aq.sq.mu.Unlock()
	require.Equal(t, r.mem[:64], b.mr.Bytes()[:64], "the mapping is b's memory")

	// b's receive completes as before; the next write lands where it is told.
	wc := pollWait(t, b.cq, 1)[0]
	require.Equal(t, verbs.WCSuccess, wc.Status)
	require.Equal(t, uint32(1), wc.Imm)
	copy(a.mr.Bytes()[128:], "after the scribbling")
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{writeImm(2, a.mr, b.mr, 128, 20)}))
	require.Equal(t, verbs.WCSuccess, pollWait(t, a.cq, 1)[0].Status)
	require.Equal(t, uint32(2), pollWait(t, b.cq, 1)[0].Imm)
	require.Equal(t, "after the scribbling", string(b.mr.Bytes()[128:148]))
}

// TestScribbledChannel: a responder that writes garbage into the channel (impossible
// cursors, an oversized or malformed record) has the requester end the connection at
// once: with an ACK timeout of 0, which would wait forever for a silent responder, the
// WR completes with RETRY_EXC_ERR and the QP goes to ERROR: a clean error, no crash, no
// hang.
func TestScribbledChannel(t *testing.T) {
	tests := []struct {
		name     string
		scribble func(ch *channel)
	}{
		{"CursorAhead", func(ch *channel) { atomic.StoreUint64(ch.word64(offRespProd), 1<<50) }},
		{"CursorMisaligned", func(ch *channel) { atomic.StoreUint64(ch.word64(offRespProd), 3) }},
		{"RecordTooLong", func(ch *channel) {
			le.PutUint32(ch.mem[chanHeader+reqRingSize:], responseLen+8)
			atomic.StoreUint64(ch.word64(offRespProd), 24)
		}},
		{"GarbageRecord", func(ch *channel) {
			r := ch.responseRing()
			r.push([]byte{0xff, 1, 2, 3}, false)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProvider(t, 1)
			q := &QP{}
			ln, err := listenQP(q)
			require.NoError(t, err)
			var wg sync.WaitGroup
			t.Cleanup(func() { ln.Close(); wg.Wait() })
			wg.Add(1)
			go func() { // a responder that maps each channel it is given and scribbles on it
				defer wg.Done()
				for {
					c, err := ln.AcceptUnix()
					if err != nil {
						return
					}
					buf, oob := make([]byte, 64), make([]byte, unix.CmsgSpace(4))
					_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
					if fds := parseFDs(oob[:oobn]); err == nil && len(fds) == 1 {
						if ch, err := mapChannel(fds[0], nil); err == nil {
							tt.scribble(ch)
							c.Write(doorbell) // the requester may sleep
							ch.unmap()
						}
					}
					for { // hold the connection until the requester drops it
						if _, err := c.Read(buf); err != nil {
							break
						}
					}
					c.Close()
				}
			}()
			a := newEnd(t, p, "shm0", 4096)
			a.link(t, a.gid, q.qpn, 0, 2) // ACK timeout 0: only a broken link ends the wait
			wr := writeImm(1, a.mr, a.mr, 0, 64)
			require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr}))
			wc := pollWait(t, a.cq, 1)[0]
			require.Equal(t, verbs.WCRetryExcErr, wc.Status, "completion %+v", wc)
			require.Equal(t, verbs.QPStateError, a.qp.State())
		})
	}
}

// TestUnreadRegionAnswers: a requester that floods its responder with region queries
// and never reads the socket their answers travel on holds up its own connection and
// nothing else. The responder's goroutine blocks writing the answers; the Polls and the
// arming of the responder's CQ, which drive and mark every ring that feeds it, still
// return, and another connection on the same CQs carries on.
func TestUnreadRegionAnswers(t *testing.T) {
	p := newProvider(t, 2)
	a := newEnd(t, p, "shm0", 4096)
	b := newEnd(t, p, "shm1", 4096)
	connectEnds(t, a, b, 14, 3) // a never posts: the test poses as a's QP

	// Queries fill the request ring before the hello arrives, so that the responder
	// drains them at once, more than the socket holds unread.
	fd, ch := channelFD(t)
	reqs := ch.requestRing()
	query := (&msg{kind: msgMRQuery, rkey: b.mr.RKey()}).encode(nil)
	queries := 0
	for {
		ok, _, err := reqs.push(query, false)
		require.NoError(t, err)
		if !ok {
			break
		}
		queries++
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: qpSocketName(b.qp.QPN()), Net: "unixpacket"})
	require.NoError(t, err)
	defer c.Close()
	hello := (&msg{kind: msgHello, srcQPN: a.qp.QPN(), dstQPN: b.qp.QPN(), srcGID: a.gid}).encode(nil)
	_, _, err = c.WriteMsgUnix(hello, unix.UnixRights(fd), nil)
	require.NoError(t, err)

	// The responder stops consuming once the socket is full: its cursor stands still
	// short of the last query (the test's precondition, not its assertion).
	cons := ch.word64(offReqCons)
	total := uint64(queries) * align8(4+uint64(len(query)))
	last, still := uint64(0), 0
	for deadline := time.Now().Add(20 * time.Second); still < 100; {
		require.False(t, time.Now().After(deadline), "the responder consumed %d of %d bytes of queries and did not stop", last, total)
		time.Sleep(time.Millisecond)
		if now := atomic.LoadUint64(cons); now != last || now == 0 {
			last, still = now, 0
			continue
		}
		still++
	}
	require.Less(t, last, total, "the socket took every answer unread: nothing blocked")

	// Polls and arming of b's CQ return while the responder is blocked.
	returned := make(chan error, 1)
	go func() {
		var wc [4]verbs.WorkCompletion
		if _, err := b.cq.Poll(wc[:]); err != nil {
			returned <- err
			return
		}
		returned <- b.cq.ReqNotify(false)
	}()
	select {
	case err := <-returned:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Poll or ReqNotify of the responder's CQ blocked behind a requester that does not read its socket")
	}

	// Another connection on the same CQs carries on.
	caps := verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	aq, err := a.pd.CreateQP(verbs.QPInitAttr{SendCQ: a.cq, RecvCQ: a.cq, Caps: caps})
	require.NoError(t, err)
	defer aq.Close()
	bq, err := b.pd.CreateQP(verbs.QPInitAttr{SendCQ: b.cq, RecvCQ: b.cq, Caps: caps})
	require.NoError(t, err)
	defer bq.Close()
	a2, b2 := &end{qp: aq, gid: a.gid}, &end{qp: bq, gid: b.gid}
	connectEnds(t, a2, b2, 14, 3)
	require.NoError(t, bq.PostRecv([]verbs.RecvWR{{ID: 1}}))
	copy(a.mr.Bytes(), "carry on")
	require.NoError(t, aq.PostSend([]verbs.SendWR{writeImm(9, a.mr, b.mr, 0, 8)}))
	require.Equal(t, verbs.WCSuccess, pollWait(t, a.cq, 1)[0].Status)
	require.Equal(t, verbs.WCSuccess, pollWait(t, b.cq, 1)[0].Status)
	require.Equal(t, "carry on", string(b.mr.Bytes()[:8]))
}

// TestDrainBatches: a drain takes at most maxDrainBatch records from a ring, however
// many the peer published, and the next drain takes the next ones. A drain holds the
// ring's lock, which arming the CQ needs; a peer that kept its ring full (it maps the
// channel and moves the cursors as it likes) would otherwise hold up the arming, and
// with it every connection of the CQ, for as long as it flooded.
func TestDrainBatches(t *testing.T) {
	p := newProvider(t, 2)
	a := newEnd(t, p, "shm0", 4096)
	b := newEnd(t, p, "shm1", 4096)
	connectEnds(t, a, b, 14, 3)
	const records = 3*maxDrainBatch + 5
	fill := func(t *testing.T, r ring, rec []byte) {
		for range records {
			ok, _, err := r.push(rec, false)
			require.True(t, ok && err == nil, "push: %v, %v", ok, err)
		}
	}
	batches := func(t *testing.T, mu *sync.Mutex, drain func() (int, error)) []int {
		var got []int
		for {
			mu.Lock()
			n, err := drain()
			mu.Unlock()
			require.NoError(t, err)
			if n == 0 {
				return got
			}
			got = append(got, n)
		}
	}
	want := []int{maxDrainBatch, maxDrainBatch, maxDrainBatch, 5}

	t.Run("Requests", func(t *testing.T) {
		// Requests from b's peer with a PSN from the future: dropped, each answered.
		_, ch := channelFD(t)
		fill(t, ch.requestRing(), (&msg{kind: msgRequest, op: opWrite, psn: 1 << 22}).encode(nil))
		bq := b.qp.(*QP)
		in := &inbound{q: bq, src: requester{gid: a.gid, qpn: a.qp.QPN()}, ch: ch,
			reqs: ch.requestRing(), resps: ch.responseRing(), buf: make([]byte, maxMsg),
			out: make([]byte, 0, regionLen), reply: regionAnswer{fd: -1}}
		require.Equal(t, want, batches(t, &in.mu, in.drainLocked))
	})
	t.Run("Responses", func(t *testing.T) {
		// Responses on a connection that is not its QP's: each ignored.
		_, ch := channelFD(t)
		fill(t, ch.responseRing(), (&msg{kind: msgResponse, respKind: respAck}).encode(nil))
		pc := &peerConn{q: a.qp.(*QP), ch: ch, resp: ch.responseRing()}
		require.Equal(t, want, batches(t, &pc.mu, pc.drainLocked))
	})
}

package verbstest

import (
	"bytes"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// config describes the endpoints of a test: their QPs, CQs, memory and transport settings.
type config struct {
	caps      verbs.QPCaps
	sendCQE   int
	recvCQE   int
	signalAll bool
	qpAccess  verbs.AccessFlags // remote access the QPs accept
	mrSize    int
	mrAccess  verbs.AccessFlags
	channel   bool // create a completion channel for the CQs

	rnrRetry   uint8
	rnrTimer   uint8
	timeout    uint8
	retryCount uint8
}

const allAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead

func defaults() config {
	return config{
		caps:       verbs.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64},
		sendCQE:    256,
		recvCQE:    256,
		qpAccess:   allAccess,
		mrSize:     1 << 16,
		mrAccess:   allAccess,
		rnrRetry:   7,
		rnrTimer:   rnrTimer,
		timeout:    ackTimeout,
		retryCount: retryCount,
	}
}

// endpoint is one side of a connection: a QP with its context, PD, CQs and one region.
type endpoint struct {
	t        *testing.T
	name     string
	ctx      verbs.Context
	pd       verbs.PD
	ch       verbs.CompChannel
	scq, rcq verbs.CQ
	qp       verbs.QP
	mr       verbs.MR
	extra    []verbs.MR // more regions, closed before the PD
	port     verbs.PortAttr
	gidIndex uint8
	gid      verbs.GID
	psn      uint32
	cfg      config
	guest    bool // ctx belongs to another endpoint, which closes it
}

var psnSeq atomic.Uint32

// providers are the providers of a rule's two sides: side a (device 0) is always local
// to the test; side b (device 1) is the same provider, or a remote peer's.
type providers struct{ a, b verbs.Provider }

// of returns the provider of device dev: b for odd devices, a for even ones.
func (p providers) of(dev int) verbs.Provider {
	if dev%2 == 1 {
		return p.b
	}
	return p.a
}

// newEndpoint opens device dev (modulo the number of devices of its provider, see
// [providers.of]) and creates an endpoint whose QP is in RESET. Everything it creates is
// destroyed when the test ends, in dependency order; a destroy that fails fails the test.
func newEndpoint(t *testing.T, pp providers, dev int, name string, cfg config) *endpoint {
	t.Helper()
	p := pp.of(dev)
	devs, err := p.Devices()
	require.NoError(t, err)
	require.NotEmpty(t, devs)
	attr := devs[dev%len(devs)]
	e := &endpoint{t: t, name: name, cfg: cfg, psn: 0x10000 + psnSeq.Add(0x111)&0xffff}
	e.ctx, err = p.Open(attr.Name)
	require.NoError(t, err, "open %s", attr.Name)
	t.Cleanup(e.destroy)

	found := false
	for _, port := range attr.Ports {
		if port.State == verbs.PortActive {
			e.port, found = port, true
			break
		}
	}
	require.True(t, found, "device %s has no active port", attr.Name)
	e.gidIndex, e.gid = pickGID(e.port)
	e.create()
	return e
}

// newEndpointOn creates an endpoint on the open context of host, with a protection
// domain, CQs, region and QP of its own: a second connection of one process on one
// device. The context stays host's, which closes it after this endpoint (cleanups run
// last-registered first).
func newEndpointOn(t *testing.T, host *endpoint, name string, cfg config) *endpoint {
	t.Helper()
	e := &endpoint{t: t, name: name, cfg: cfg, psn: 0x10000 + psnSeq.Add(0x111)&0xffff,
		ctx: host.ctx, port: host.port, gidIndex: host.gidIndex, gid: host.gid, guest: true}
	t.Cleanup(e.destroy)
	e.create()
	return e
}

// create allocates the endpoint's PD, channel, CQs, region and QP on its open context.
func (e *endpoint) create() {
	t, cfg := e.t, e.cfg
	t.Helper()
	var err error
	e.pd, err = e.ctx.AllocPD()
	require.NoError(t, err)
	if cfg.channel {
		e.ch, err = e.ctx.CreateCompChannel()
		require.NoError(t, err)
	}
	e.scq, err = e.ctx.CreateCQ(cfg.sendCQE, e.ch, 0)
	require.NoError(t, err)
	e.rcq, err = e.ctx.CreateCQ(cfg.recvCQE, e.ch, 0)
	require.NoError(t, err)
	e.mr, err = e.pd.RegMR(cfg.mrSize, cfg.mrAccess)
	require.NoError(t, err)
	e.qp, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, Caps: cfg.caps, SignalAll: cfg.signalAll})
	require.NoError(t, err)
	require.Equal(t, verbs.QPStateReset, e.qp.State(), "state of a new QP")
}

// pickGID prefers a RoCE v2 GID holding an IPv4 address, then any RoCE v2 GID, then the
// first GID in use.
func pickGID(port verbs.PortAttr) (uint8, verbs.GID) {
	best := -1
	score := func(g verbs.GIDEntry) int {
		switch {
		case g.GID.IsZero():
			return -1
		case g.Type == verbs.GIDTypeRoCEv2 && g.GID.Addr().Is4():
			return 3
		case g.Type == verbs.GIDTypeRoCEv2:
			return 2
		}
		return 1
	}
	for i, g := range port.GIDs {
		if best < 0 || score(g) > score(port.GIDs[best]) {
			best = i
		}
	}
	if best < 0 {
		return 0, verbs.GID{}
	}
	return uint8(port.GIDs[best].Index), port.GIDs[best].GID
}

func (e *endpoint) destroy() {
	closeAll := func(what string, c interface{ Close() error }) {
		if c == nil {
			return
		}
		if err := c.Close(); err != nil {
			e.t.Errorf("%s: close %s: %v", e.name, what, err)
		}
	}
	if e.qp != nil {
		closeAll("QP", e.qp)
	}
	if e.mr != nil {
		closeAll("MR", e.mr)
	}
	for _, m := range e.extra {
		closeAll("MR", m)
	}
	if e.scq != nil {
		closeAll("send CQ", e.scq)
	}
	if e.rcq != nil {
		closeAll("receive CQ", e.rcq)
	}
	if e.ch != nil {
		closeAll("completion channel", e.ch)
	}
	if e.pd != nil {
		closeAll("PD", e.pd)
	}
	if !e.guest {
		closeAll("context", e.ctx)
	}
}

// regMR registers another region in the endpoint's PD.
func (e *endpoint) regMR(size int, access verbs.AccessFlags) verbs.MR {
	e.t.Helper()
	m, err := e.pd.RegMR(size, access)
	require.NoError(e.t, err)
	e.extra = append(e.extra, m)
	return m
}

// sge names n bytes at offset off of region m.
func sge(m verbs.MR, off, n int) verbs.SGE {
	return verbs.SGE{Addr: m.Addr() + uint64(off), Length: uint32(n), LKey: m.LKey()}
}

func (e *endpoint) toInit() {
	e.t.Helper()
	require.NoError(e.t, e.qp.ToInit(verbs.InitAttr{Port: e.port.Num, Access: e.cfg.qpAccess}), "%s: to INIT", e.name)
}

func (e *endpoint) rtrAttr(peer *endpoint) verbs.RTRAttr {
	return verbs.RTRAttr{
		PathMTU: min(e.port.ActiveMTU, peer.port.ActiveMTU),
		DestQPN: peer.qp.QPN(),
		RQPSN:   peer.psn,
		Dest: verbs.AddressVector{
			LID: peer.port.LID, Port: e.port.Num, IsGlobal: true,
			DestGID: peer.gid, SGIDIndex: e.gidIndex, HopLimit: 64,
		},
		MaxDestRdAtomic: 1,
		MinRNRTimer:     e.cfg.rnrTimer,
	}
}

func (e *endpoint) toRTR(peer *endpoint) {
	e.t.Helper()
	require.NoError(e.t, e.qp.ToRTR(e.rtrAttr(peer)), "%s: to RTR", e.name)
}

func (e *endpoint) rtsAttr() verbs.RTSAttr {
	return verbs.RTSAttr{SQPSN: e.psn, Timeout: e.cfg.timeout, RetryCount: e.cfg.retryCount, RNRRetry: e.cfg.rnrRetry, MaxRdAtomic: 1}
}

func (e *endpoint) toRTS() {
	e.t.Helper()
	require.NoError(e.t, e.qp.ToRTS(e.rtsAttr()), "%s: to RTS", e.name)
}

// connect brings both QPs to RTS, each connected to the other.
func connect(a, b *endpoint) {
	a.t.Helper()
	a.toInit()
	b.toInit()
	a.toRTR(b)
	b.toRTR(a)
	a.toRTS()
	b.toRTS()
}

// newPair returns two connected endpoints, a and b, on different devices if the provider
// has two. b's configuration is cfg too unless bcfg is given.
func newPair(t *testing.T, p providers, cfg config, bcfg ...config) (a, b *endpoint) {
	t.Helper()
	a = newEndpoint(t, p, 0, "a", cfg)
	if len(bcfg) > 0 {
		cfg = bcfg[0]
	}
	b = newEndpoint(t, p, 1, "b", cfg)
	connect(a, b)
	return a, b
}

// post posts send work requests and requires success.
func post(t *testing.T, qp verbs.QP, wrs ...verbs.SendWR) {
	t.Helper()
	require.NoError(t, qp.PostSend(wrs))
}

// postRecv posts receive requests and requires success.
func postRecv(t *testing.T, qp verbs.QP, wrs ...verbs.RecvWR) {
	t.Helper()
	require.NoError(t, qp.PostRecv(wrs))
}

// postRecvs posts n receive requests without buffers, with IDs from first on.
func postRecvs(t *testing.T, qp verbs.QP, first uint64, n int) {
	t.Helper()
	for i := range n {
		postRecv(t, qp, verbs.RecvWR{ID: first + uint64(i)})
	}
}

// requirePostError requires err to be a *verbs.PostError for request index, wrapping want.
func requirePostError(t *testing.T, err error, index int, want error) {
	t.Helper()
	var pe *verbs.PostError
	require.ErrorAs(t, err, &pe, "post error")
	require.Equal(t, index, pe.Index, "index of the rejected request in %v", err)
	if want != nil {
		require.ErrorIs(t, err, want)
	}
}

// writeWR is a signaled RDMA WRITE (or, with imm, WRITE_WITH_IMM) of n bytes from offset
// off of the endpoint's region to offset roff of the peer region dst.
func writeWR(id uint64, src verbs.MR, off, n int, dst verbs.MR, roff int, op verbs.Opcode, flags verbs.SendFlags) verbs.SendWR {
	wr := verbs.SendWR{ID: id, Opcode: op, Flags: flags, Imm: uint32(id), RemoteAddr: dst.Addr() + uint64(roff), RKey: dst.RKey()}
	if n > 0 {
		wr.SGL = []verbs.SGE{sge(src, off, n)}
	}
	return wr
}

// sendWR is a SEND of n bytes from offset off of region src.
func sendWR(id uint64, src verbs.MR, off, n int, flags verbs.SendFlags) verbs.SendWR {
	wr := verbs.SendWR{ID: id, Opcode: verbs.OpSend, Flags: flags}
	if n > 0 {
		wr.SGL = []verbs.SGE{sge(src, off, n)}
	}
	return wr
}

// backoff yields for a while after the spins-th empty poll: first the processor, then a
// short sleep, so that waiting costs little CPU on a busy machine. The sleep stays real:
// the suite runs against kernel devices (ibv) whose completions arrive in real time, and
// it only paces polls for something that must happen, bounded by waitLimit.
func backoff(spins int) {
	if spins < 200 {
		runtime.Gosched()
		return
	}
	time.Sleep(100 * time.Microsecond)
}

// pollN polls cq until it has n completions and returns them. It fails the test if they
// don't arrive within waitLimit or if the CQ reports an error.
func pollN(t *testing.T, cq verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, 16)
	deadline := time.Now().Add(waitLimit)
	for spins := 0; len(out) < n; spins++ {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		require.NoError(t, err, "poll after %d of %d completions", len(out), n)
		out = append(out, buf[:k]...)
		if k > 0 {
			spins = 0
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %d completions, got %d: %v", waitLimit, n, len(out), out)
		}
		backoff(spins)
	}
	return out
}

// pollOne polls one completion.
func pollOne(t *testing.T, cq verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	return pollN(t, cq, 1)[0]
}

// requireEmpty requires that cq has no completion now.
func requireEmpty(t *testing.T, cq verbs.CQ, why string) {
	t.Helper()
	var wc [4]verbs.WorkCompletion
	n, err := cq.Poll(wc[:])
	require.NoError(t, err)
	require.Zero(t, n, "%s: unexpected completions %v", why, wc[:n])
}

// requireWC requires a completion's WRID and status.
func requireWC(t *testing.T, wc verbs.WorkCompletion, id uint64, status verbs.WCStatus) {
	t.Helper()
	require.Equal(t, status, wc.Status, "status of WR %d (completion %+v)", id, wc)
	require.Equal(t, id, wc.WRID, "WRID of completion %+v", wc)
}

// requireWCIn requires a completion's WRID and one of the statuses the verbs contract
// allows for it, where real devices legitimately differ.
func requireWCIn(t *testing.T, wc verbs.WorkCompletion, id uint64, allowed ...verbs.WCStatus) {
	t.Helper()
	require.Contains(t, allowed, wc.Status, "status of WR %d (completion %+v): want one of %v", id, wc, allowed)
	require.Equal(t, id, wc.WRID, "WRID of completion %+v", wc)
}

// waitFor polls cond until it holds, failing the test after waitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for spins := 0; !cond(); spins++ {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", waitLimit, what)
		}
		backoff(spins)
	}
}

// waitState waits until qp is in state st.
func waitState(t *testing.T, qp verbs.QP, st verbs.QPState) {
	t.Helper()
	waitFor(t, fmt.Sprintf("QP %#x to reach %v (it is %v)", qp.QPN(), st, qp.State()), func() bool { return qp.State() == st })
}

// readByte returns byte off of region m, asking a remote peer for it if m is remote.
func readByte(t *testing.T, m verbs.MR, off int) byte {
	t.Helper()
	return readBytes(t, m, off, 1)[0]
}

// readBytes returns a copy of n bytes at offset off of region m.
func readBytes(t *testing.T, m verbs.MR, off, n int) []byte {
	t.Helper()
	if r, ok := m.(*remoteMR); ok {
		b, err := r.ReadAt(off, n)
		require.NoError(t, err, "read %d bytes at %d of a remote region", n, off)
		return b
	}
	return bytes.Clone(m.Bytes()[off : off+n])
}

// writeBytes copies data to offset off of region m, over the wire if m is remote.
func writeBytes(t *testing.T, m verbs.MR, off int, data []byte) {
	t.Helper()
	if r, ok := m.(*remoteMR); ok {
		require.NoError(t, r.WriteAt(off, data), "write %d bytes at %d of a remote region", len(data), off)
		return
	}
	copy(m.Bytes()[off:], data)
}

// fillMR writes the pattern of fill into n bytes at offset off of region m.
func fillMR(t *testing.T, m verbs.MR, off, n, seed int) {
	t.Helper()
	b := make([]byte, n)
	fill(b, seed)
	writeBytes(t, m, off, b)
}

// fill writes a pattern derived from seed into b.
func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*31 + i*7 + 1)
	}
}

// sendCapacity returns the send-queue capacity the QP reports, or 0 if it reports none.
func sendCapacity(qp verbs.QP) int {
	if c, ok := qp.(CapsReporter); ok {
		return c.Caps().MaxSendWR
	}
	return 0
}

// recvCapacity returns the receive-queue capacity the QP reports, or 0.
func recvCapacity(qp verbs.QP) int {
	if c, ok := qp.(CapsReporter); ok {
		return c.Caps().MaxRecvWR
	}
	return 0
}

// fillLimit bounds how many WRs a test posts while looking for a queue's real capacity.
func fillLimit(requested int) int { return 4*requested + 64 }

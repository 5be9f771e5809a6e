package rdma

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// fakeProvider is a verbs.Provider that does only what the engine's device, setup and
// teardown code calls, and counts what it has handed out, so that device selection,
// sharing, warmth, events, budgets and limits are tested without a provider that moves
// data (verbs/soft). Its CQs never complete anything and its QPs deliver nothing: the
// data paths have their own fakes (conn_fake_test.go, poller_test.go).
type fakeProvider struct {
	name string

	mu       sync.Mutex
	devs     []verbs.DeviceAttr
	fail     map[string]error // by step: "devices", "open", "pd", "mr", "chan", "cq", "qp", "init", "recv"
	recvRoom int              // when set, each QP takes this many receive WQEs, and fails the next
	listGate chan struct{}    // when set, Devices waits until it is closed
	openGate chan struct{}    // when set, Open waits until it is closed
	listings int              // calls of Devices
	opens    int              // successful calls of Open
	ctxs     []*fakeContext
	live     fakeCounts
	qpn      uint32
	addr     uint64
}

// fakeCounts are a fake provider's objects alive.
type fakeCounts struct{ Contexts, PDs, MRs, QPs, CQs, Chans int }

// fakeDevice is a RoCE device with one active port whose GID 0 is ip.
func fakeDevice(name string, ip netip.Addr) verbs.DeviceAttr {
	return verbs.DeviceAttr{
		Name: name, NumCompVectors: 1,
		Ports: []verbs.PortAttr{{
			Num: 1, State: verbs.PortActive, MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU1024,
			LinkLayer: verbs.LinkLayerEthernet,
			GIDs:      []verbs.GIDEntry{{Index: 0, GID: verbs.GIDFromAddr(ip), Type: verbs.GIDTypeRoCEv2, Netdev: "eth0"}},
		}},
	}
}

// newFakeProvider returns a provider of devs, or of one device serving loopback.
func newFakeProvider(devs ...verbs.DeviceAttr) *fakeProvider {
	if len(devs) == 0 {
		devs = []verbs.DeviceAttr{fakeDevice("fake0", loopback)}
	}
	return &fakeProvider{name: "fake", devs: devs, fail: make(map[string]error)}
}

// failAt makes step fail with err from now on (nil: succeed again).
func (p *fakeProvider) failAt(step string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail[step] = err
}

func (p *fakeProvider) failure(step string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fail[step]
}

// counts returns the objects alive and the Devices and Open calls so far.
func (p *fakeProvider) counts() (live fakeCounts, listings, opens int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live, p.listings, p.opens
}

// count adds d to the live count picked by f.
func (p *fakeProvider) count(f func(*fakeCounts) *int, d int) {
	p.mu.Lock()
	*f(&p.live) += d
	p.mu.Unlock()
}

// context returns the i-th context Open returned.
func (p *fakeProvider) context(i int) *fakeContext {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ctxs[i]
}

func (p *fakeProvider) Name() string { return p.name }

func (p *fakeProvider) Devices() ([]verbs.DeviceAttr, error) {
	p.mu.Lock()
	gate := p.listGate
	p.mu.Unlock()
	if gate != nil {
		<-gate
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listings++
	if err := p.fail["devices"]; err != nil {
		return nil, err
	}
	return append([]verbs.DeviceAttr(nil), p.devs...), nil
}

func (p *fakeProvider) Open(name string) (verbs.Context, error) {
	p.mu.Lock()
	gate := p.openGate
	p.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if err := p.failure("open"); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.devs {
		if d.Name == name {
			c := &fakeContext{p: p, attr: d}
			p.ctxs = append(p.ctxs, c)
			p.opens++
			p.live.Contexts++
			return c, nil
		}
	}
	return nil, fmt.Errorf("fake: no device %s: %w", name, verbs.ErrNoDevice)
}

// requireFakeReleased closes p's idle devices and checks that nothing of p is left.
func requireFakeReleased(t *testing.T, p *fakeProvider) {
	t.Helper()
	require.NoError(t, CloseIdle(p))
	live, _, _ := p.counts()
	require.Zero(t, live, "objects of the fake provider left")
}

// fakeContext is an open fake device. Its asynchronous events are the test's to push.
type fakeContext struct {
	p      *fakeProvider
	attr   verbs.DeviceAttr
	events verbs.AsyncEventQueue

	mu     sync.Mutex
	closed bool
}

func (c *fakeContext) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *fakeContext) Device() verbs.DeviceAttr { return c.attr }

func (c *fakeContext) QueryPort(num uint8) (verbs.PortAttr, error) {
	if num == 0 || int(num) > len(c.attr.Ports) {
		return verbs.PortAttr{}, fmt.Errorf("fake: port %d: %w", num, verbs.ErrInvalidArgument)
	}
	return c.attr.Ports[num-1], nil
}

func (c *fakeContext) AllocPD() (verbs.PD, error) {
	if err := c.p.failure("pd"); err != nil {
		return nil, err
	}
	c.p.count(func(n *fakeCounts) *int { return &n.PDs }, 1)
	return &fakePD{p: c.p}, nil
}

func (c *fakeContext) CreateCompChannel() (verbs.CompChannel, error) {
	if err := c.p.failure("chan"); err != nil {
		return nil, err
	}
	c.p.count(func(n *fakeCounts) *int { return &n.Chans }, 1)
	return &fakeChannel{p: c.p, closed: make(chan struct{})}, nil
}

func (c *fakeContext) CreateCQ(cqe int, ch verbs.CompChannel, vector int) (verbs.CQ, error) {
	if err := c.p.failure("cq"); err != nil {
		return nil, err
	}
	c.p.count(func(n *fakeCounts) *int { return &n.CQs }, 1)
	return &fakeIdleCQ{p: c.p, cqe: cqe}, nil
}

func (c *fakeContext) WaitAsyncEvent(ctx context.Context) (verbs.AsyncEvent, error) {
	return c.events.Wait(ctx)
}

func (c *fakeContext) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return verbs.ErrClosed
	}
	c.closed = true
	c.events.Close()
	c.p.count(func(n *fakeCounts) *int { return &n.Contexts }, -1)
	return nil
}

// fakeChannel is a completion channel on which nothing ever arrives.
type fakeChannel struct {
	p      *fakeProvider
	once   sync.Once
	closed chan struct{}
}

func (ch *fakeChannel) Wait(ctx context.Context) (verbs.CQ, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-ch.closed:
		return nil, verbs.ErrClosed
	}
}

func (ch *fakeChannel) Close() error {
	ch.once.Do(func() {
		close(ch.closed)
		ch.p.count(func(n *fakeCounts) *int { return &n.Chans }, -1)
	})
	return nil
}

// fakeIdleCQ is a CQ in which nothing ever completes.
type fakeIdleCQ struct {
	p   *fakeProvider
	cqe int // the entries asked for
}

func (q *fakeIdleCQ) Poll([]verbs.WorkCompletion) (int, error) { return 0, nil }
func (q *fakeIdleCQ) ReqNotify(bool) error                     { return nil }
func (q *fakeIdleCQ) Close() error {
	q.p.count(func(n *fakeCounts) *int { return &n.CQs }, -1)
	return nil
}

type fakePD struct{ p *fakeProvider }

func (pd *fakePD) RegMR(n int, access verbs.AccessFlags) (verbs.MR, error) {
	if err := pd.p.failure("mr"); err != nil {
		return nil, err
	}
	pd.p.mu.Lock()
	pd.p.addr += 1 << 32
	addr := pd.p.addr
	pd.p.live.MRs++
	pd.p.mu.Unlock()
	return &fakeMR{p: pd.p, b: make([]byte, n), addr: addr, access: access}, nil
}

func (pd *fakePD) CreateQP(attr verbs.QPInitAttr) (verbs.QP, error) {
	if err := pd.p.failure("qp"); err != nil {
		return nil, err
	}
	pd.p.mu.Lock()
	defer pd.p.mu.Unlock()
	pd.p.qpn++
	pd.p.live.QPs++
	return &fakeVerbsQP{p: pd.p, qpn: pd.p.qpn, attr: attr}, nil
}

func (pd *fakePD) Close() error {
	pd.p.count(func(n *fakeCounts) *int { return &n.PDs }, -1)
	return nil
}

type fakeMR struct {
	p      *fakeProvider
	b      []byte
	addr   uint64
	access verbs.AccessFlags
}

func (m *fakeMR) Bytes() []byte             { return m.b }
func (m *fakeMR) Addr() uint64              { return m.addr }
func (m *fakeMR) LKey() uint32              { return uint32(m.addr >> 32) }
func (m *fakeMR) RKey() uint32              { return uint32(m.addr>>32) | 1<<31 }
func (m *fakeMR) Access() verbs.AccessFlags { return m.access }
func (m *fakeMR) Close() error              { m.p.count(func(n *fakeCounts) *int { return &n.MRs }, -1); return nil }

// fakeVerbsQP is a QP that goes through its states and takes every post, delivering
// nothing.
type fakeVerbsQP struct {
	p    *fakeProvider
	qpn  uint32
	attr verbs.QPInitAttr // what it was created with

	mu    sync.Mutex
	state verbs.QPState
	rts   verbs.RTSAttr // what it was moved to RTS with
	sends int
	recvs int
}

func (q *fakeVerbsQP) QPN() uint32               { return q.qpn }
func (q *fakeVerbsQP) State() verbs.QPState      { q.mu.Lock(); defer q.mu.Unlock(); return q.state }
func (q *fakeVerbsQP) ToRTR(verbs.RTRAttr) error { return q.to(verbs.QPStateRTR) }
func (q *fakeVerbsQP) ToRTS(a verbs.RTSAttr) error {
	q.mu.Lock()
	q.rts = a
	q.mu.Unlock()
	return q.to(verbs.QPStateRTS)
}
func (q *fakeVerbsQP) ToError() error { return q.to(verbs.QPStateError) }
func (q *fakeVerbsQP) ToReset() error { return q.to(verbs.QPStateReset) }

func (q *fakeVerbsQP) to(s verbs.QPState) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.state = s
	return nil
}

func (q *fakeVerbsQP) ToInit(verbs.InitAttr) error {
	if err := q.p.failure("init"); err != nil {
		return err
	}
	return q.to(verbs.QPStateInit)
}

func (q *fakeVerbsQP) PostSend(wrs []verbs.SendWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sends += len(wrs)
	return nil
}

func (q *fakeVerbsQP) PostRecv(wrs []verbs.RecvWR) error {
	if err := q.p.failure("recv"); err != nil {
		return &verbs.PostError{Err: err}
	}
	q.p.mu.Lock()
	room := q.p.recvRoom
	q.p.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if room > 0 && q.recvs+len(wrs) > room {
		i := room - q.recvs
		q.recvs = room
		return &verbs.PostError{Index: i, Err: verbs.ErrQueueFull}
	}
	q.recvs += len(wrs)
	return nil
}

func (q *fakeVerbsQP) Close() error {
	q.p.count(func(n *fakeCounts) *int { return &n.QPs }, -1)
	return nil
}

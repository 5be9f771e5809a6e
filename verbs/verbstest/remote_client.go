package verbstest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// callSlack bounds a call besides the time the agent may block in it: a call that takes
// longer means a dead agent or wire, and fails the call instead of hanging the test.
const callSlack = 10 * time.Second

// RemoteProvider is a [verbs.Provider] whose objects live in an agent process (see
// [ServeAgent]): each method is a call over the connection. Calls are serialized; each
// is bounded by a deadline, and a connection that failed fails every later call.
type RemoteProvider struct {
	mu     sync.Mutex
	conn   net.Conn
	name   string
	broken error
	objs   map[uint64]any // proxies by handle, for the CQ of a channel event
}

// DialAgent connects to the agent at addr (host:port).
func DialAgent(ctx context.Context, addr string) (*RemoteProvider, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("verbstest: dial agent: %w", err)
	}
	r := &RemoteProvider{conn: conn, objs: map[uint64]any{}}
	rep, err := r.do(call{Op: "name"}, 0)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if rep.Device != nil {
		r.name = rep.Device.Name
	}
	return r, nil
}

// Close ends the session: the agent destroys what is left and returns.
func (r *RemoteProvider) Close() error {
	_, err := r.do(call{Op: "bye"}, 0)
	if cerr := r.conn.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("verbstest: close agent connection: %w", cerr)
	}
	return err
}

// do makes one call; block is how long the agent may block in it besides.
func (r *RemoteProvider) do(c call, block time.Duration) (reply, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rep reply
	if r.broken != nil {
		return rep, r.broken
	}
	r.conn.SetDeadline(time.Now().Add(callSlack + block))
	err := writeFrame(r.conn, c)
	if err == nil {
		err = readFrame(r.conn, &rep)
	}
	if err != nil {
		r.broken = fmt.Errorf("verbstest: agent %s: %s: %w", r.conn.RemoteAddr(), c.Op, err)
		r.conn.Close()
		return rep, r.broken
	}
	if err := rep.Err.decode(); err != nil {
		return rep, fmt.Errorf("verbstest: agent %s: %s: %w", r.conn.RemoteAddr(), c.Op, err)
	}
	return rep, nil
}

// closeObj destroys the agent's object h and forgets its proxy.
func (r *RemoteProvider) closeObj(h uint64) error {
	if _, err := r.do(call{Op: "close", H: h}, 0); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.objs, h)
	r.mu.Unlock()
	return nil
}

func (r *RemoteProvider) track(h uint64, o any) {
	r.mu.Lock()
	r.objs[h] = o
	r.mu.Unlock()
}

// Name returns "agent:" and the name of the agent's provider.
func (r *RemoteProvider) Name() string { return "agent:" + r.name }

// Devices returns the devices the agent serves.
func (r *RemoteProvider) Devices() ([]verbs.DeviceAttr, error) {
	rep, err := r.do(call{Op: "devices"}, 0)
	return rep.Devices, err
}

// Open opens a device of the agent.
func (r *RemoteProvider) Open(device string) (verbs.Context, error) {
	rep, err := r.do(call{Op: "open", Name: device}, 0)
	if err != nil {
		return nil, err
	}
	c := &remoteContext{r: r, h: rep.H}
	if rep.Device != nil {
		c.dev = *rep.Device
	}
	r.track(rep.H, c)
	return c, nil
}

type remoteContext struct {
	r   *RemoteProvider
	h   uint64
	dev verbs.DeviceAttr
}

func (c *remoteContext) Device() verbs.DeviceAttr { return c.dev }
func (c *remoteContext) Close() error             { return c.r.closeObj(c.h) }

// WaitAsyncEvent is not carried by the agent's protocol: the conformance rules on
// events run in one process, against the provider itself.
func (c *remoteContext) WaitAsyncEvent(context.Context) (verbs.AsyncEvent, error) {
	return verbs.AsyncEvent{}, fmt.Errorf("verbstest: remote async events: %w", verbs.ErrNotSupported)
}

func (c *remoteContext) QueryPort(num uint8) (verbs.PortAttr, error) {
	rep, err := c.r.do(call{Op: "queryPort", H: c.h, N: int(num)}, 0)
	if err != nil || rep.Port == nil {
		return verbs.PortAttr{}, err
	}
	return *rep.Port, nil
}

func (c *remoteContext) AllocPD() (verbs.PD, error) {
	rep, err := c.r.do(call{Op: "allocPD", H: c.h}, 0)
	if err != nil {
		return nil, err
	}
	pd := &remotePD{r: c.r, h: rep.H}
	c.r.track(rep.H, pd)
	return pd, nil
}

func (c *remoteContext) CreateCompChannel() (verbs.CompChannel, error) {
	rep, err := c.r.do(call{Op: "createChannel", H: c.h}, 0)
	if err != nil {
		return nil, err
	}
	ch := &remoteChannel{r: c.r, h: rep.H}
	c.r.track(rep.H, ch)
	return ch, nil
}

func (c *remoteContext) CreateCQ(cqe int, ch verbs.CompChannel, vector int) (verbs.CQ, error) {
	cl := call{Op: "createCQ", H: c.h, N: cqe, Off: vector}
	if ch != nil {
		rch, ok := ch.(*remoteChannel)
		if !ok || rch.r != c.r {
			return nil, fmt.Errorf("verbstest: create CQ: channel of another provider: %w", verbs.ErrInvalidArgument)
		}
		cl.SendCQ = rch.h
	}
	rep, err := c.r.do(cl, 0)
	if err != nil {
		return nil, err
	}
	cq := &remoteCQ{r: c.r, h: rep.H, capacity: rep.Capacity}
	c.r.track(rep.H, cq)
	return cq, nil
}

type remotePD struct {
	r *RemoteProvider
	h uint64
}

func (p *remotePD) Close() error { return p.r.closeObj(p.h) }

func (p *remotePD) RegMR(length int, access verbs.AccessFlags) (verbs.MR, error) {
	rep, err := p.r.do(call{Op: "regMR", H: p.h, N: length, Access: access}, 0)
	if err != nil {
		return nil, err
	}
	m := &remoteMR{r: p.r, h: rep.H, addr: rep.Addr, lkey: rep.LKey, rkey: rep.RKey, len: rep.Len, access: rep.Access}
	p.r.track(rep.H, m)
	return m, nil
}

func (p *remotePD) CreateQP(attr verbs.QPInitAttr) (verbs.QP, error) {
	scq, ok1 := attr.SendCQ.(*remoteCQ)
	rcq, ok2 := attr.RecvCQ.(*remoteCQ)
	if !ok1 || !ok2 || scq.r != p.r || rcq.r != p.r {
		return nil, fmt.Errorf("verbstest: create QP: CQs of another provider: %w", verbs.ErrInvalidArgument)
	}
	rep, err := p.r.do(call{Op: "createQP", H: p.h, SendCQ: scq.h, RecvCQ: rcq.h, Caps: attr.Caps, SignalAll: attr.SignalAll}, 0)
	if err != nil {
		return nil, err
	}
	q := &remoteQP{r: p.r, h: rep.H, qpn: rep.QPN}
	if rep.Caps != nil {
		q.caps = *rep.Caps
	}
	p.r.track(rep.H, q)
	return q, nil
}

// remoteMR is a region of the agent. Bytes returns a copy fetched from the agent: writes to
// it stay local; ReadAt and WriteAt move parts of the region.
type remoteMR struct {
	r          *RemoteProvider
	h          uint64
	addr       uint64
	lkey, rkey uint32
	len        int
	access     verbs.AccessFlags
}

func (m *remoteMR) Addr() uint64              { return m.addr }
func (m *remoteMR) LKey() uint32              { return m.lkey }
func (m *remoteMR) RKey() uint32              { return m.rkey }
func (m *remoteMR) Access() verbs.AccessFlags { return m.access }
func (m *remoteMR) Close() error              { return m.r.closeObj(m.h) }

// Bytes returns a copy of the region as it is now, or nil if the agent cannot be asked.
func (m *remoteMR) Bytes() []byte {
	b, err := m.ReadAt(0, m.len)
	if err != nil {
		return nil
	}
	return b
}

// ReadAt returns a copy of n bytes of the region from offset off.
func (m *remoteMR) ReadAt(off, n int) ([]byte, error) {
	rep, err := m.r.do(call{Op: "read", H: m.h, Off: off, N: n}, 0)
	if err == nil && len(rep.Data) != n {
		err = fmt.Errorf("verbstest: agent returned %d bytes for %d", len(rep.Data), n)
	}
	return rep.Data, err
}

// WriteAt copies data into the region at offset off.
func (m *remoteMR) WriteAt(off int, data []byte) error {
	_, err := m.r.do(call{Op: "write", H: m.h, Off: off, Data: data}, 0)
	return err
}

type remoteCQ struct {
	r        *RemoteProvider
	h        uint64
	capacity int
}

func (c *remoteCQ) Close() error { return c.r.closeObj(c.h) }

// Capacity returns the capacity the agent's CQ reports, 0 if it reports none.
func (c *remoteCQ) Capacity() int { return c.capacity }

func (c *remoteCQ) Poll(wc []verbs.WorkCompletion) (int, error) {
	rep, err := c.r.do(call{Op: "poll", H: c.h, N: min(len(wc), maxBatch)}, 0)
	n := copy(wc, rep.WCs)
	return n, err
}

func (c *remoteCQ) ReqNotify(solicitedOnly bool) error {
	_, err := c.r.do(call{Op: "reqNotify", H: c.h, Solicited: solicitedOnly}, 0)
	return err
}

type remoteChannel struct {
	r *RemoteProvider
	h uint64
}

func (ch *remoteChannel) Close() error { return ch.r.closeObj(ch.h) }

// Wait waits in the agent until ctx's deadline (waitLimit without one). The call cannot be
// interrupted: a ctx canceled while it blocks takes effect when it returns.
func (ch *remoteChannel) Wait(ctx context.Context) (verbs.CQ, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	timeout := waitLimit
	if d, ok := ctx.Deadline(); ok {
		timeout = min(time.Until(d), waitLimit)
		if timeout <= 0 {
			return nil, context.DeadlineExceeded
		}
	}
	rep, err := ch.r.do(call{Op: "wait", H: ch.h, Timeout: timeout}, timeout)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ch.r.mu.Lock()
	cq, ok := ch.r.objs[rep.H].(*remoteCQ)
	ch.r.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("verbstest: agent: event for unknown CQ handle %d", rep.H)
	}
	return cq, nil
}

type remoteQP struct {
	r    *RemoteProvider
	h    uint64
	qpn  uint32
	caps verbs.QPCaps
}

func (q *remoteQP) QPN() uint32        { return q.qpn }
func (q *remoteQP) Close() error       { return q.r.closeObj(q.h) }
func (q *remoteQP) Caps() verbs.QPCaps { return q.caps }
func (q *remoteQP) ToError() error     { return q.simple("toError") }
func (q *remoteQP) ToReset() error     { return q.simple("toReset") }
func (q *remoteQP) simple(op string) error {
	_, err := q.r.do(call{Op: op, H: q.h}, 0)
	return err
}

// State returns the QP's state, or QPState(-1) if the agent cannot be asked.
func (q *remoteQP) State() verbs.QPState {
	rep, err := q.r.do(call{Op: "state", H: q.h}, 0)
	if err != nil {
		return -1
	}
	return rep.State
}

func (q *remoteQP) ToInit(attr verbs.InitAttr) error {
	_, err := q.r.do(call{Op: "toInit", H: q.h, Init: &attr}, 0)
	return err
}

func (q *remoteQP) ToRTR(attr verbs.RTRAttr) error {
	_, err := q.r.do(call{Op: "toRTR", H: q.h, RTR: &attr}, 0)
	return err
}

func (q *remoteQP) ToRTS(attr verbs.RTSAttr) error {
	_, err := q.r.do(call{Op: "toRTS", H: q.h, RTS: &attr}, 0)
	return err
}

func (q *remoteQP) PostSend(wr []verbs.SendWR) error {
	_, err := q.r.do(call{Op: "postSend", H: q.h, Send: wr}, 0)
	return err
}

func (q *remoteQP) PostRecv(wr []verbs.RecvWR) error {
	_, err := q.r.do(call{Op: "postRecv", H: q.h, Recv: wr}, 0)
	return err
}

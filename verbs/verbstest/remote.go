package verbstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// Two hosts: the rules that involve a peer run with the peer in another process, on
// another device, across a real wire. The peer's process runs [ServeAgent] on the verbs
// provider of its host; the test process calls [DialAgent] and gets a [verbs.Provider]
// whose every object (context, PD, CQ, region, QP) lives in the agent. A [Suite] whose
// side b is that provider runs every rule with each pair's b end in the agent. The wire
// format is described in remote_wire.go.

// Bounds the agent puts on what a call may ask, so that a bad call fails instead of
// exhausting the agent.
const (
	maxRegion  = 16 << 20 // bytes of one region
	maxEntries = 1 << 16  // CQ entries, queue capacities
	maxBatch   = 4096     // work requests of one post, completions of one poll
	maxSGE     = 64       // SGEs of one work request
	callSlack  = 10 * time.Second
)

// ServeAgent accepts one client on ln, closes ln, and serves the client with provider p
// until the client ends the session (see [RemoteProvider.Close]) or the connection
// breaks. Whatever the client left open is destroyed before it returns. It returns nil
// after a session the client ended.
func ServeAgent(ln net.Listener, p verbs.Provider) error {
	conn, err := ln.Accept()
	ln.Close()
	if err != nil {
		return fmt.Errorf("verbstest agent: accept: %w", err)
	}
	defer conn.Close()
	return serveAgent(conn, p)
}

// serveAgent serves one session on rw.
func serveAgent(rw io.ReadWriter, p verbs.Provider) error {
	a := &agent{p: p, objs: map[uint64]any{}}
	defer a.closeAll()
	for {
		var c call
		if err := readFrame(rw, &c); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("verbstest agent: client left without ending the session: %w", io.ErrUnexpectedEOF)
			}
			return fmt.Errorf("verbstest agent: %w", err)
		}
		r, err := a.handle(c)
		r.Err = encodeError(err)
		if err := writeFrame(rw, r); err != nil {
			return fmt.Errorf("verbstest agent: %w", err)
		}
		if c.Op == "bye" {
			return nil
		}
	}
}

// agent holds the objects of one session by handle.
type agent struct {
	p     verbs.Provider
	next  uint64
	objs  map[uint64]any
	order []uint64 // handles in creation order
}

func (a *agent) add(o any) uint64 {
	a.next++
	a.objs[a.next] = o
	a.order = append(a.order, a.next)
	return a.next
}

// closeAll destroys what is left, newest first, so that dependents go before what they
// depend on.
func (a *agent) closeAll() {
	for i := len(a.order) - 1; i >= 0; i-- {
		if o, ok := a.objs[a.order[i]].(interface{ Close() error }); ok {
			o.Close()
		}
	}
	clear(a.objs)
	a.order = nil
}

// object returns the object of handle h if it has type T.
func object[T any](a *agent, h uint64) (T, error) {
	o, ok := a.objs[h].(T)
	if !ok {
		return o, fmt.Errorf("handle %d names no %T: %w", h, o, verbs.ErrInvalidArgument)
	}
	return o, nil
}

func (a *agent) handle(c call) (reply, error) {
	var r reply
	switch c.Op {
	case "bye":
		return r, nil
	case "name":
		r.Device = &verbs.DeviceAttr{Name: a.p.Name()}
		return r, nil
	case "devices":
		devs, err := a.p.Devices()
		r.Devices = devs
		return r, err
	case "open":
		ctx, err := a.p.Open(c.Name)
		if err != nil {
			return r, err
		}
		d := ctx.Device()
		r.H, r.Device = a.add(ctx), &d
		return r, nil
	case "close":
		o, err := object[interface{ Close() error }](a, c.H)
		if err != nil {
			return r, err
		}
		if err := o.Close(); err != nil {
			return r, err
		}
		delete(a.objs, c.H)
		return r, nil
	case "queryPort", "allocPD", "createChannel", "createCQ":
		return a.handleContext(c)
	case "regMR", "createQP":
		return a.handlePD(c)
	case "poll", "reqNotify":
		return a.handleCQ(c)
	case "wait":
		return a.handleWait(c)
	case "read", "write":
		return a.handleMR(c)
	case "state", "toInit", "toRTR", "toRTS", "toError", "toReset", "postSend", "postRecv":
		return a.handleQP(c)
	}
	return r, fmt.Errorf("unknown call %q: %w", c.Op, verbs.ErrNotSupported)
}

func (a *agent) handleContext(c call) (reply, error) {
	var r reply
	ctx, err := object[verbs.Context](a, c.H)
	if err != nil {
		return r, err
	}
	switch c.Op {
	case "queryPort":
		if c.N < 0 || c.N > 255 {
			return r, fmt.Errorf("port %d: %w", c.N, verbs.ErrInvalidArgument)
		}
		port, err := ctx.QueryPort(uint8(c.N))
		r.Port = &port
		return r, err
	case "allocPD":
		pd, err := ctx.AllocPD()
		if err != nil {
			return r, err
		}
		r.H = a.add(pd)
	case "createChannel":
		ch, err := ctx.CreateCompChannel()
		if err != nil {
			return r, err
		}
		r.H = a.add(ch)
	case "createCQ":
		var ch verbs.CompChannel
		if c.SendCQ != 0 {
			if ch, err = object[verbs.CompChannel](a, c.SendCQ); err != nil {
				return r, err
			}
		}
		if c.N > maxEntries {
			return r, fmt.Errorf("CQ of %d entries: %w", c.N, verbs.ErrInvalidArgument)
		}
		cq, err := ctx.CreateCQ(c.N, ch)
		if err != nil {
			return r, err
		}
		if cr, ok := cq.(CapacityReporter); ok {
			r.Capacity = cr.Capacity()
		}
		r.H = a.add(cq)
	}
	return r, nil
}

func (a *agent) handlePD(c call) (reply, error) {
	var r reply
	pd, err := object[verbs.PD](a, c.H)
	if err != nil {
		return r, err
	}
	switch c.Op {
	case "regMR":
		if c.N > maxRegion {
			return r, fmt.Errorf("region of %d bytes: %w", c.N, verbs.ErrInvalidArgument)
		}
		m, err := pd.RegMR(c.N, c.Access)
		if err != nil {
			return r, err
		}
		r.H, r.Addr, r.LKey, r.RKey, r.Len, r.Access = a.add(m), m.Addr(), m.LKey(), m.RKey(), len(m.Bytes()), m.Access()
	case "createQP":
		scq, err := object[verbs.CQ](a, c.SendCQ)
		if err != nil {
			return r, err
		}
		rcq, err := object[verbs.CQ](a, c.RecvCQ)
		if err != nil {
			return r, err
		}
		k := c.Caps
		for _, v := range []int{k.MaxSendWR, k.MaxRecvWR, k.MaxSendSGE, k.MaxRecvSGE, k.MaxInlineData} {
			if v > maxEntries {
				return r, fmt.Errorf("QP capacities %+v: %w", k, verbs.ErrInvalidArgument)
			}
		}
		qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, Caps: k, SignalAll: c.SignalAll})
		if err != nil {
			return r, err
		}
		if cr, ok := qp.(CapsReporter); ok {
			caps := cr.Caps()
			r.Caps = &caps
		}
		r.H, r.QPN = a.add(qp), qp.QPN()
	}
	return r, nil
}

func (a *agent) handleCQ(c call) (reply, error) {
	var r reply
	cq, err := object[verbs.CQ](a, c.H)
	if err != nil {
		return r, err
	}
	if c.Op == "reqNotify" {
		return r, cq.ReqNotify(c.Solicited)
	}
	if c.N < 0 || c.N > maxBatch {
		return r, fmt.Errorf("poll %d completions: %w", c.N, verbs.ErrInvalidArgument)
	}
	wc := make([]verbs.WorkCompletion, c.N)
	n, err := cq.Poll(wc)
	r.WCs = wc[:n]
	return r, err
}

func (a *agent) handleWait(c call) (reply, error) {
	var r reply
	ch, err := object[verbs.CompChannel](a, c.H)
	if err != nil {
		return r, err
	}
	timeout := c.Timeout
	if timeout <= 0 || timeout > waitLimit {
		timeout = waitLimit
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cq, err := ch.Wait(ctx)
	if err != nil {
		return r, err
	}
	for h, o := range a.objs {
		if o == cq {
			r.H = h
			return r, nil
		}
	}
	return r, fmt.Errorf("event for a CQ the session does not know")
}

func (a *agent) handleMR(c call) (reply, error) {
	var r reply
	m, err := object[verbs.MR](a, c.H)
	if err != nil {
		return r, err
	}
	b := m.Bytes()
	n := c.N
	if c.Op == "write" {
		n = len(c.Data)
	}
	if c.Off < 0 || n < 0 || c.Off > len(b) || n > len(b)-c.Off {
		return r, fmt.Errorf("%s %d bytes at %d of a %d-byte region: %w", c.Op, n, c.Off, len(b), verbs.ErrInvalidArgument)
	}
	if c.Op == "write" {
		copy(b[c.Off:], c.Data)
	} else {
		r.Data = append([]byte{}, b[c.Off:c.Off+n]...)
	}
	return r, nil
}

func (a *agent) handleQP(c call) (reply, error) {
	var r reply
	qp, err := object[verbs.QP](a, c.H)
	if err != nil {
		return r, err
	}
	switch c.Op {
	case "state":
		r.State = qp.State()
		return r, nil
	case "toInit":
		if c.Init == nil {
			return r, fmt.Errorf("to INIT without attributes: %w", verbs.ErrInvalidArgument)
		}
		return r, qp.ToInit(*c.Init)
	case "toRTR":
		if c.RTR == nil {
			return r, fmt.Errorf("to RTR without attributes: %w", verbs.ErrInvalidArgument)
		}
		return r, qp.ToRTR(*c.RTR)
	case "toRTS":
		if c.RTS == nil {
			return r, fmt.Errorf("to RTS without attributes: %w", verbs.ErrInvalidArgument)
		}
		return r, qp.ToRTS(*c.RTS)
	case "toError":
		return r, qp.ToError()
	case "toReset":
		return r, qp.ToReset()
	case "postSend":
		if err := a.checkSend(c.Send); err != nil {
			return r, err
		}
		return r, qp.PostSend(c.Send)
	}
	if len(c.Recv) > maxBatch {
		return r, fmt.Errorf("post %d receive requests: %w", len(c.Recv), verbs.ErrInvalidArgument)
	}
	for _, wr := range c.Recv {
		if len(wr.SGL) > maxSGE {
			return r, fmt.Errorf("receive request with %d SGEs: %w", len(wr.SGL), verbs.ErrInvalidArgument)
		}
	}
	return r, qp.PostRecv(c.Recv)
}

// checkSend bounds a post and requires the SGEs of inline requests, which a provider reads
// from process memory at post time without a key check, to lie in this session's regions.
func (a *agent) checkSend(wrs []verbs.SendWR) error {
	if len(wrs) > maxBatch {
		return fmt.Errorf("post %d send requests: %w", len(wrs), verbs.ErrInvalidArgument)
	}
	for _, wr := range wrs {
		if len(wr.SGL) > maxSGE {
			return fmt.Errorf("send request with %d SGEs: %w", len(wr.SGL), verbs.ErrInvalidArgument)
		}
		if wr.Flags&verbs.SendInline == 0 {
			continue
		}
		for _, s := range wr.SGL {
			if !a.holds(s) {
				return fmt.Errorf("inline SGE %#x+%d outside the session's regions: %w", s.Addr, s.Length, verbs.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// holds reports whether s lies in one of the session's regions.
func (a *agent) holds(s verbs.SGE) bool {
	for _, o := range a.objs {
		if m, ok := o.(verbs.MR); ok && s.Addr >= m.Addr() && uint64(s.Length) <= uint64(len(m.Bytes())) && s.Addr-m.Addr() <= uint64(len(m.Bytes()))-uint64(s.Length) {
			return true
		}
	}
	return false
}

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

func (c *remoteContext) CreateCQ(cqe int, ch verbs.CompChannel) (verbs.CQ, error) {
	cl := call{Op: "createCQ", H: c.h, N: cqe}
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

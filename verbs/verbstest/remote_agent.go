package verbstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

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
		cq, err := ctx.CreateCQ(c.N, ch, c.Off)
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

package soft

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

// eventHub is a device's asynchronous-event state: the contexts open on it, which
// receive its events, and its ports' states as SetPortState left them.
type eventHub struct {
	mu       sync.Mutex
	contexts map[*Context]struct{}
	down     atomic.Bool  // some port is not active: the device's traffic is lost
	state    [8]PortState // by port number - 1; 0 means the port's initial state
}

// compVectors is the number of completion vectors a soft device reports. They change
// nothing in soft, but CreateCQ checks the vector as a device does.
const compVectors = 4

// PortState is a verbs.PortState; the alias keeps events.go's table short.
type PortState = verbs.PortState

func (h *eventHub) add(c *Context) {
	h.mu.Lock()
	if h.contexts == nil {
		h.contexts = make(map[*Context]struct{})
	}
	h.contexts[c] = struct{}{}
	h.mu.Unlock()
}

func (h *eventHub) remove(c *Context) {
	h.mu.Lock()
	delete(h.contexts, c)
	h.mu.Unlock()
}

// broadcast queues e on every context open on the device, as the kernel delivers a
// device's events to every user context.
func (h *eventHub) broadcast(e verbs.AsyncEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.contexts {
		c.events.Push(e)
	}
}

// portState returns port num's state: set by SetPortState, else initial.
func (h *eventHub) portState(num uint8, initial PortState) PortState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if num >= 1 && int(num) <= len(h.state) && h.state[num-1] != 0 {
		return h.state[num-1]
	}
	return initial
}

// WaitAsyncEvent returns the device's next asynchronous event (see
// [verbs.Context.WaitAsyncEvent]). Soft devices raise EventPortErr and
// EventPortActive through [Fabric.SetPortState], EventDeviceFatal through
// [Fabric.FailDevice], and EventQPFatal through [Fabric.FailQP].
func (c *Context) WaitAsyncEvent(ctx context.Context) (verbs.AsyncEvent, error) {
	e, err := c.events.Wait(ctx)
	if err != nil && errors.Is(err, verbs.ErrClosed) {
		return e, fmt.Errorf("soft: %w", err)
	}
	return e, err // ctx.Err() as is, as verbs asks: a wait ended on purpose builds no error
}

// SetPortState sets the state of port num of the named device, as a link going down
// or up does (`ip link set dev down` under rxe). A port that leaves the active state
// raises EventPortErr on every context open on the device, one that becomes active
// EventPortActive; Devices and QueryPort report the new state.
//
// While a port is not active the device neither sends nor receives: QPs are not
// moved to ERROR (rxe leaves them alone), but their requests are lost, so a requester
// retransmits and, its retry count spent, completes with RETRY_EXC_ERR, as on a link
// whose netdev is down.
func (f *Fabric) SetPortState(device string, num uint8, state verbs.PortState) error {
	d, ok := f.byName[device]
	if !ok {
		return fmt.Errorf("soft: set port state of %q: %w", device, verbs.ErrNoDevice)
	}
	if num < 1 || int(num) > len(d.attr.Ports) || int(num) > len(d.events.state) {
		return fmt.Errorf("soft: set port state of %s port %d: %w", device, num, verbs.ErrInvalidArgument)
	}
	if state < verbs.PortDown || state > verbs.PortActiveDefer {
		return fmt.Errorf("soft: set port state of %s port %d to %v: %w", device, num, state, verbs.ErrInvalidArgument)
	}
	f.faultsUsed.Store(true)
	h := &d.events
	h.mu.Lock()
	old := d.attr.Ports[num-1].State
	if s := h.state[num-1]; s != 0 {
		old = s
	}
	h.state[num-1] = state
	down := false
	for i, p := range d.attr.Ports {
		s := p.State
		if i < len(h.state) && h.state[i] != 0 {
			s = h.state[i]
		}
		down = down || s != verbs.PortActive
	}
	h.down.Store(down)
	h.mu.Unlock()
	switch {
	case old == verbs.PortActive && state != verbs.PortActive:
		h.broadcast(verbs.AsyncEvent{Type: verbs.EventPortErr, Port: num})
	case old != verbs.PortActive && state == verbs.PortActive:
		h.broadcast(verbs.AsyncEvent{Type: verbs.EventPortActive, Port: num})
	}
	return nil
}

// RaisePortEvent raises an event of a port-event type (EventGIDChange,
// EventLIDChange, ...) on every context open on the device, as a port's attributes
// changing does. It changes nothing else.
func (f *Fabric) RaisePortEvent(device string, num uint8, typ verbs.AsyncEventType) error {
	d, ok := f.byName[device]
	if !ok {
		return fmt.Errorf("soft: raise %v on %q: %w", typ, device, verbs.ErrNoDevice)
	}
	if !typ.PortEvent() || num < 1 || int(num) > len(d.attr.Ports) {
		return fmt.Errorf("soft: raise %v on %s port %d: %w", typ, device, num, verbs.ErrInvalidArgument)
	}
	d.events.broadcast(verbs.AsyncEvent{Type: typ, Port: num})
	return nil
}

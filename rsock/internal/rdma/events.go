package rdma

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

// deviceEvents listens to one open device's asynchronous events, from the opening of
// the device until its release, on one goroutine parked in WaitAsyncEvent (which, on
// rdma-core, waits on the async fd through the netpoller: no thread per device).
//
// What the events mean to the engine:
//
//   - EventDeviceFatal fails every connection on the device at once with
//     ErrDeviceFatal; the next connection opens the device afresh (or finds it gone
//     and falls back) instead of sharing this context.
//   - EventPortErr fails every connection on that port at once with ErrPortDown: the
//     port neither sends nor receives, and waiting for each QP's retries to run out
//     (or, for a connection with nothing in flight, for its next keepalive) would
//     leave Reads and Writes blocked meanwhile.
//   - Every port event (EventPortErr, EventPortActive, EventGIDChange,
//     EventLIDChange, ...) also drops the provider's cached device listing, so that
//     the next connection chooses its port and GID, and reads the MTU and LID, from
//     the device as it is now, never from a listing made before the change.
//
// QP and CQ errors need nothing here: they also reach the connection as failed
// completions, which the poller dispatches.
type deviceEvents struct {
	provider  verbs.Provider
	listenCtx stopCtx // the listener's context, nil while it is not running
	done      sync.WaitGroup
	counted   atomic.Bool // counted in listening
	// fatal is set by EventDeviceFatal: acquireDevice opens the device afresh rather
	// than share this one, which its connections release as they close.
	fatal atomic.Bool
}

// listening counts, per provider, the devices whose events are listened to: only then
// is a cached device listing sure to be dropped when a port changes.
var listening = struct {
	sync.Mutex
	n map[verbs.Provider]int
}{n: make(map[verbs.Provider]int)}

// listened reports whether some device of p has its events listened to.
func listened(p verbs.Provider) bool {
	listening.Lock()
	defer listening.Unlock()
	return listening.n[p] > 0
}

// start runs the listener of d, whose context is open.
func (e *deviceEvents) start(d *device) {
	listening.Lock()
	listening.n[d.key.provider]++
	listening.Unlock()
	e.provider = d.key.provider
	e.counted.Store(true)
	e.run(d)
}

// run starts the listener of d. The previous one has ended: pause and run are
// serialized (by devices' lock, or the device being new), and pause waits for it.
func (e *deviceEvents) run(d *device) {
	e.listenCtx = newStopCtx()
	e.done.Add(1)
	go d.listen(e.listenCtx, &e.done)
}

// stop ends the listener and waits for it; the device's context must still be open.
func (e *deviceEvents) stop() {
	e.pause()
	e.uncount()
}

// pause ends the listener and waits for it, leaving the device counted in listening:
// the context queues its events meanwhile, and resume hands them to a new listener.
// An idle device pauses (warm.go), so that it holds no goroutine.
func (e *deviceEvents) pause() {
	if e.listenCtx == nil {
		return
	}
	close(e.listenCtx)
	e.done.Wait()
	e.listenCtx = nil
}

// resume restarts the listener of d that pause ended, counting d in listening again
// if it had stopped counting (its provider has no events).
func (e *deviceEvents) resume(d *device) {
	if e.counted.Load() {
		e.run(d)
		return
	}
	e.start(d)
}

// uncount takes the device out of listening, once.
func (e *deviceEvents) uncount() {
	if !e.counted.CompareAndSwap(true, false) {
		return
	}
	listening.Lock()
	if listening.n[e.provider]--; listening.n[e.provider] <= 0 {
		delete(listening.n, e.provider)
	}
	listening.Unlock()
}

// listen handles d's events until ctx ends or the context closes.
func (d *device) listen(ctx context.Context, done *sync.WaitGroup) {
	defer done.Done()
	for {
		ev, err := d.ctx.WaitAsyncEvent(ctx)
		if err != nil {
			// ctx ended (release or pause: they uncount as they need), the context
			// is closed, or the provider has no events to give (ErrNotSupported):
			// nothing more to listen to, and nothing to drop a cached listing when a
			// port changes.
			if ctx.Err() == nil {
				d.events.uncount()
			}
			return
		}
		d.handleEvent(ev)
	}
}

// handleEvent applies one asynchronous event of d.
func (d *device) handleEvent(ev verbs.AsyncEvent) {
	if ev.Type.PortEvent() || ev.Type == verbs.EventDeviceFatal {
		invalidateDeviceAttrs(d.key.provider)
	}
	switch ev.Type {
	case verbs.EventDeviceFatal:
		d.events.fatal.Store(true)
		d.failConns(0, fmt.Errorf("%w: %s", ErrDeviceFatal, d.key.name))
	case verbs.EventPortErr:
		d.failConns(ev.Port, fmt.Errorf("%w: %s port %d", ErrPortDown, d.key.name, ev.Port))
	}
}

// failConns fails every connection of d on port (every port if 0) with err.
func (d *device) failConns(port uint8, err error) {
	d.mu.Lock()
	pollers := append([]*poller(nil), d.pollers...)
	d.mu.Unlock()
	for _, p := range pollers {
		for _, h := range p.handlerList() {
			c, ok := h.(*Conn)
			if !ok || (port != 0 && c.ep.path.port.Num != port) {
				continue
			}
			c.mu.Lock()
			c.failLocked(err)
			c.mu.Unlock()
		}
	}
}

// invalidateDeviceAttrs drops p's cached device listing: the next deviceAttrs lists
// the devices again. A listing in flight still answers the callers waiting for it.
func invalidateDeviceAttrs(p verbs.Provider) {
	attrCache.Lock()
	delete(attrCache.byProvider, p)
	attrCache.Unlock()
}

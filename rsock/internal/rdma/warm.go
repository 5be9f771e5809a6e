package rdma

import (
	"errors"
	"net/netip"
	"reflect"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// This file keeps devices warm between connections. Setting a connection up on a cold
// device costs a device listing (on rdma-core, opening every device and reading its
// GID tables from sysfs), opening the device, creating a completion channel and a CQ
// (whose entries the provider clears), and starting the event listener. A process that
// connects, closes and connects again would pay all of it each time.
//
// So when its last connection lets go, a device goes idle instead of closing: it keeps
// its context and one healthy CQ (its poller has no goroutine while no QP is attached),
// and its event listener pauses, so that an idle device holds no goroutine of the
// engine's (rdma-core's context keeps its own reader of async events; CloseIdle, and
// rsock.CloseIdleDevices, release it); the context queues its events meanwhile, and the listener that resumes with the next
// connection handles them. The device's listing stays in the cache (deviceAttrs) while
// it is idle, within attrCacheTTL as always; a port change while it idles is therefore
// seen by the listener only once the next connection has chosen its port and GID from
// the listing, which can make that one connection fall back (its path proof fails), never
// lose bytes.
//
// An idle device closes after deviceIdleTimeout without a connection, and at most
// maxIdleDevices stay idle at once: one more closes the one idle longest. CloseIdle
// closes them at once; Cool also makes a provider's devices in use close with their
// last connection rather than idle, until the provider's next connection (a Listener's
// Close cools its provider, so that a server that shuts down releases its devices as
// its connections end).

const (
	// deviceIdleTimeout is how long an unused device stays open.
	deviceIdleTimeout = 10 * time.Second
	// maxIdleDevices bounds the devices kept open unused, over all providers.
	maxIdleDevices = 4
)

// idleDevices counts the idle devices and numbers their idle periods, and holds the
// cooled providers (Cool). Guarded by devices' lock, as are the idle fields of each
// device.
var idleDevices = struct {
	n      int
	seq    uint64
	cooled map[verbs.Provider]bool
}{cooled: make(map[verbs.Provider]bool)}

// keepsWarm reports whether d may go idle when unused; devices is locked.
func (d *device) keepsWarm() bool {
	return !d.events.fatal.Load() && devices.open[d.key] == d && !idleDevices.cooled[d.key.provider]
}

// sleep makes the device, whose last reference is gone, idle; devices is locked. It
// keeps the first healthy poller's CQ and closes the others.
func (d *device) sleep() error {
	d.events.pause()
	d.mu.Lock()
	var keep *poller
	var drop []*poller
	for _, p := range d.pollers {
		if keep == nil && p.healthy() {
			keep = p
			continue
		}
		drop = append(drop, p)
	}
	d.pollers = d.pollers[:0]
	if keep != nil {
		d.pollers = append(d.pollers, keep)
	}
	d.mu.Unlock()
	var errs []error
	for _, p := range drop {
		errs = append(errs, p.close())
	}

	idleDevices.seq++
	idleDevices.n++
	d.idle, d.idleSeq = true, idleDevices.seq
	d.idleUntil = time.Now().Add(deviceIdleTimeout)
	if d.idleTimer == nil {
		d.idleTimer = time.AfterFunc(deviceIdleTimeout, d.expire)
	} else {
		d.idleTimer.Reset(deviceIdleTimeout) // one timer for all the device's idle periods
	}
	if idleDevices.n > maxIdleDevices {
		errs = append(errs, closeIdleLocked(oldestIdleLocked()))
	}
	return errors.Join(errs...)
}

// wake takes the idle device back into use; devices is locked.
func (d *device) wake() {
	d.unidle()
	d.events.resume(d)
}

// unidle ends the device's idle period; devices is locked. Its timer, if it has fired
// already, finds the period over (expire).
func (d *device) unidle() {
	d.idle = false
	d.idleTimer.Stop()
	idleDevices.n--
}

// expire closes the device if it is idle and its idle period has run out: a timer that
// fired for an earlier period, just before the device was woken, finds it in use or
// idle again with a later end, and the timer is due again then. Nobody is left to be
// told of an error in closing the device.
func (d *device) expire() {
	devices.Lock()
	defer devices.Unlock()
	if d.idle && !time.Now().Before(d.idleUntil) {
		closeIdleLocked(d)
	}
}

// oldestIdleLocked returns the device idle the longest; devices is locked and at least
// one device is idle.
func oldestIdleLocked() *device {
	var oldest *device
	for _, d := range devices.open {
		if d.idle && (oldest == nil || d.idleSeq < oldest.idleSeq) {
			oldest = d
		}
	}
	return oldest
}

// closeIdleLocked closes the idle device d; devices is locked.
func closeIdleLocked(d *device) error {
	d.unidle()
	return d.closeLocked()
}

// CloseIdle closes the idle devices of provider p (of every provider if p is nil) at
// once, instead of after their idle timeout. Devices in use are left alone.
func CloseIdle(p verbs.Provider) error {
	return closeIdle(func(q verbs.Provider) bool { return p == nil || q == p })
}

// Cool closes the idle devices of provider p now, and makes those in use close when
// their last connection does, instead of staying warm, until the next connection on p.
func Cool(p verbs.Provider) error {
	if p == nil || !reflect.TypeOf(p).Comparable() {
		return nil // no device of it was ever opened
	}
	devices.Lock()
	for _, d := range devices.open {
		if d.key.provider == p && !d.idle { // else nothing to remember: closeIdle closes it
			idleDevices.cooled[p] = true
			break
		}
	}
	devices.Unlock()
	return CloseIdle(p)
}

// uncoolLocked forgets that p was cooled once none of its devices is open, so that the
// record holds no provider for longer than its devices; devices is locked.
func uncoolLocked(p verbs.Provider) {
	if !idleDevices.cooled[p] {
		return
	}
	for _, d := range devices.open {
		if d.key.provider == p {
			return
		}
	}
	delete(idleDevices.cooled, p)
}

// closeIdle closes the idle devices whose provider matches.
func closeIdle(match func(verbs.Provider) bool) error {
	devices.Lock()
	defer devices.Unlock()
	var errs []error
	for _, d := range devices.open {
		if d.idle && match(d.key.provider) {
			errs = append(errs, closeIdleLocked(d))
		}
	}
	return errors.Join(errs...)
}

// healthy reports whether the poller's CQ has not failed.
func (p *poller) healthy() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.err == nil
}

// Warm reports whether preparing an endpoint on provider p for local address ip with
// opts would find its device open and the provider's device listing cached: then
// PrepareContext makes only the connection's own verbs calls (a queue pair, and a
// protection domain and registrations unless a pooled shell serves: pool.go), and
// lists and opens nothing. rsock's client sends its
// hello in one piece when the device is warm, and its first bytes ahead of the
// preparation when it is not.
func Warm(p verbs.Provider, ip netip.Addr, opts Options) bool {
	if !reflect.TypeOf(p).Comparable() {
		return false
	}
	now := time.Now()
	attrCache.Lock()
	l := attrCache.byProvider[p]
	fresh := l != nil && l.finished && l.err == nil && now.Before(l.until)
	attrCache.Unlock()
	if !fresh || !listened(p) {
		return false
	}
	chosen, err := verbs.Selector{RoCEVersion: opts.roceGIDType(), NetdevOf: opts.netdevOf}.Select(l.attrs, ip)
	if err != nil {
		return false
	}
	devices.Lock()
	defer devices.Unlock()
	d := devices.open[deviceKey{provider: p, name: chosen.Device.Name}]
	if d == nil || d.events.fatal.Load() {
		return false
	}
	select {
	case <-d.ready:
		return d.openErr == nil
	default:
		return false
	}
}

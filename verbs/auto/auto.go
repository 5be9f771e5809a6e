// Package auto picks the verbs provider a program uses when it names none: the
// rdma-core provider (verbs/ibv) when the program was built with -tags rdma and this
// machine has an RDMA device with an active port, and otherwise no provider, with
// the reason.
//
// # Usage
//
//	p, err := auto.Default()
//	if err != nil {
//		log.Printf("no RDMA: %v", err) // e.g. "ibv: not built with RDMA support (build with -tags rdma)"
//		// fall back to TCP
//	}
//
// # Caching
//
// [Default] is cheap to call on every dial: the first call probes, later calls return
// the cached answer. A provider, once found, is kept for the life of the process. A
// reason that cannot change while the process runs (not built with RDMA support,
// libibverbs missing: verbs.ErrNotSupported) is kept too. Any other reason (no
// device, no active port, a failure to list devices, such as a process out of file
// descriptors) is kept for [RetryInterval], after which the next call probes again, so
// a port that comes up is used without a restart, and a passing failure does not turn
// RDMA off for the life of the process.
package auto

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/ibv"
)

// RetryInterval is how long Default keeps a failure that can pass ("no device", "no
// active port", a failure to list devices) before it probes again.
const RetryInterval = 10 * time.Second

// Default returns the verbs provider to use when none is configured, or nil and an
// error saying why there is none. The error matches verbs.ErrNotSupported when RDMA
// support is not built in or libibverbs is missing, and verbs.ErrNoDevice when there is
// no device or no active port; other errors are failures to probe (see Caching).
func Default() (verbs.Provider, error) { return defaultCache.get() }

var defaultCache = &cache{probe: probe, now: time.Now}

// cache remembers the outcome of probe as described in the package docs.
type cache struct {
	probe func() (verbs.Provider, error)
	now   func() time.Time

	mu     sync.Mutex
	done   bool
	p      verbs.Provider
	err    error
	expiry time.Time // zero: keep forever
}

// Fresh reports whether [Default] would answer now from its cache, without probing,
// which lists and opens devices and can take long on a slow host. It never waits:
// while another call probes, it reports false. rsock's dialer sends its hello's first
// bytes ahead of a probe, so that a server does not take a slow probe for a client
// that speaks no rsock.
func Fresh() bool { return defaultCache.fresh() }

func (c *cache) fresh() bool {
	if !c.mu.TryLock() {
		return false // a probe is under way, or a get that is about to answer
	}
	defer c.mu.Unlock()
	return c.validLocked()
}

// validLocked reports whether the cached answer stands. Called with mu held.
func (c *cache) validLocked() bool {
	return c.done && (c.expiry.IsZero() || c.now().Before(c.expiry))
}

func (c *cache) get() (verbs.Provider, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.validLocked() {
		return c.p, c.err
	}
	c.p, c.err = c.probe()
	c.done = true
	c.expiry = time.Time{}
	if c.err != nil && !errors.Is(c.err, verbs.ErrNotSupported) {
		c.expiry = c.now().Add(RetryInterval)
	}
	return c.p, c.err
}

// probe opens the rdma-core provider and checks that a device has an active port.
func probe() (verbs.Provider, error) {
	p, err := ibv.Open()
	if err != nil {
		return nil, err
	}
	return usable(p)
}

// usable returns p if one of its devices has an ACTIVE port.
func usable(p verbs.Provider) (verbs.Provider, error) {
	devs, err := p.Devices()
	if err != nil {
		return nil, fmt.Errorf("%s: list devices: %w", p.Name(), err)
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("%s: %w", p.Name(), verbs.ErrNoDevice)
	}
	var ports []string
	for _, d := range devs {
		for _, port := range d.Ports {
			if port.State == verbs.PortActive {
				return p, nil
			}
			ports = append(ports, fmt.Sprintf("%s port %d is %v", d.Name, port.Num, port.State))
		}
		if len(d.Ports) == 0 {
			ports = append(ports, d.Name+" has no ports")
		}
	}
	return nil, &noActivePortError{provider: p.Name(), ports: ports}
}

type noActivePortError struct {
	provider string
	ports    []string
}

func (e *noActivePortError) Error() string {
	return fmt.Sprintf("%s: no active RDMA port (%s)", e.provider, strings.Join(e.ports, ", "))
}

func (e *noActivePortError) Is(target error) bool { return target == verbs.ErrNoDevice }

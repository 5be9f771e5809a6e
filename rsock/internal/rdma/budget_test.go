package rdma

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// pinningProvider is soft made to look like a provider that pins what it registers,
// and, when enomem is set, whose registrations fail with the kernel's ENOMEM.
type pinningProvider struct {
	*soft.Fabric
	enomem bool
}

func (p *pinningProvider) PinsMemory() bool { return true }

func (p *pinningProvider) Open(name string) (verbs.Context, error) {
	c, err := p.Fabric.Open(name)
	if err != nil {
		return nil, err
	}
	return enomemContext{Context: c, enomem: p.enomem}, nil
}

type enomemContext struct {
	verbs.Context
	enomem bool
}

func (c enomemContext) AllocPD() (verbs.PD, error) {
	pd, err := c.Context.AllocPD()
	if err != nil {
		return nil, err
	}
	return enomemPD{PD: pd, enomem: c.enomem}, nil
}

type enomemPD struct {
	verbs.PD
	enomem bool
}

func (p enomemPD) RegMR(n int, access verbs.AccessFlags) (verbs.MR, error) {
	if p.enomem {
		// As verbs/ibv words it: the class error, unwrapping to the errno.
		return nil, fmt.Errorf("ibv: reg mr of %d bytes: %w: %w", n, verbs.ErrNoResources, syscall.ENOMEM)
	}
	return p.PD.RegMR(n, access)
}

// setMemlock makes the engine see an RLIMIT_MEMLOCK of limit bytes for the test.
func setMemlock(t *testing.T, limit uint64, binds bool) {
	old := memlockLimit
	memlockLimit = func() (uint64, bool) { return limit, binds }
	t.Cleanup(func() { memlockLimit = old })
}

// closeIdleAll closes every idle device, the shells pooled on them (pool.go) with them:
// a test that reads the process's registered or pinned memory, over every device, or
// sets RLIMIT_MEMLOCK against it, starts from, or checks, what only connections hold.
// (With -tags rdma, an earlier test's rdma-core device and its pool may be idle.)
func closeIdleAll(t *testing.T) {
	t.Helper()
	require.NoError(t, CloseIdle(nil))
}

// registeredOn is what the engine counts as registered on ep's device.
func registeredOn(ep *Endpoint) int64 {
	registered.Lock()
	defer registered.Unlock()
	return registered.byDevice[ep.dev]
}

// TestRegisteredMemoryLimits prepares endpoints until a limit stops them: the budget
// of Options.MaxRegisteredMemory on any provider, RLIMIT_MEMLOCK on a provider that
// pins (and not when the limit does not bind). The failure names the limit and the
// figures; Abort gives the memory back, so the next Prepare fits again.
func TestRegisteredMemoryLimits(t *testing.T) {
	// Fixed rings: ring and mailbox, send buffer, registered at Prepare.
	const ringMR = 16<<10 + mailboxSize
	const perConn = ringMR + 8<<10
	// What a pinning provider pins of them: whole pages.
	page := os.Getpagesize()
	pinnedRing := (ringMR + page - 1) / page * page
	pinnedPerConn := pinnedRing + (8<<10+page-1)/page*page
	opts := Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: 8 << 10}
	tests := []struct {
		name     string
		pins     bool
		budget   int64
		memlock  uint64
		binds    bool
		fit      int    // endpoints that fit
		wantErr  error  // the next one's
		wantText string // in its message
	}{
		{"budget", false, 3 * perConn, 0, false, 3, ErrMemoryBudget, "over the budget of 73920 (MaxRegisteredMemory)"},
		{"budget not a multiple", false, 3*perConn + 100, 0, false, 3, ErrMemoryBudget, "would make 90368, over the budget of 74020"},
		{"memlock", true, 0, uint64(2 * pinnedPerConn), true, 2, ErrMemlock,
			fmt.Sprintf("over RLIMIT_MEMLOCK of %d; raise it (ulimit -l", 2*pinnedPerConn)},
		{"memlock and a larger budget", true, 10 * perConn, uint64(2 * pinnedPerConn), true, 2, ErrMemlock,
			fmt.Sprintf("would pin %d, over RLIMIT_MEMLOCK", 2*pinnedPerConn+pinnedRing)},
		{"budget below memlock", true, perConn, 10 * perConn, true, 1, ErrMemoryBudget, "over the budget of 24640"},
		{"memlock with CAP_IPC_LOCK", true, 4 * perConn, uint64(pinnedPerConn), false, 4, ErrMemoryBudget, "over the budget"},
		{"memlock ignored without pinning", false, 2 * perConn, uint64(pinnedPerConn), true, 2, ErrMemoryBudget, "over the budget"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			closeIdleAll(t) // what is pinned is counted over every device
			setMemlock(t, tt.memlock, tt.binds)
			f := soft.New(soft.Options{})
			var p verbs.Provider = f
			if tt.pins {
				p = &pinningProvider{Fabric: f}
			}
			o := opts
			o.MaxRegisteredMemory = tt.budget
			_, pinned0 := RegisteredMemory()
			var eps []*Endpoint
			t.Cleanup(func() {
				for _, ep := range eps {
					ep.Abort()
				}
			})
			for range tt.fit {
				ep, err := Prepare(p, loopback, o)
				require.NoError(t, err)
				eps = append(eps, ep)
			}
			dev := eps[0].dev
			require.EqualValues(t, tt.fit*perConn, registeredOn(eps[0]))
			_, err := Prepare(p, loopback, o)
			require.ErrorIs(t, err, tt.wantErr)
			require.Contains(t, err.Error(), tt.wantText)
			require.EqualValues(t, tt.fit*perConn, registeredOn(eps[0]), "a refused endpoint holds nothing")

			require.NoError(t, eps[0].Abort())
			ep, err := Prepare(p, loopback, o)
			require.NoError(t, err, "room again after Abort")
			eps[0] = ep
			for _, ep := range eps {
				require.NoError(t, ep.Abort())
			}
			eps = nil
			requireReleased(t, f)
			registered.Lock()
			_, left := registered.byDevice[dev]
			registered.Unlock()
			_, pinned := RegisteredMemory()
			require.False(t, left, "registrations left on the device")
			require.Equal(t, pinned0, pinned, "pinned bytes back to the baseline")
		})
	}
}

// TestMemlockENOMEM maps the kernel's ENOMEM from a registration to a reason that names
// RLIMIT_MEMLOCK and the fix, where verbs/ibv's text names neither.
func TestMemlockENOMEM(t *testing.T) {
	for _, binds := range []bool{true, false} {
		t.Run(fmt.Sprint("binds=", binds), func(t *testing.T) {
			setMemlock(t, 64<<20, binds)
			f := soft.New(soft.Options{})
			_, err := Prepare(&pinningProvider{Fabric: f, enomem: true}, loopback, Options{})
			require.ErrorIs(t, err, ErrMemlock)
			require.ErrorIs(t, err, syscall.ENOMEM)
			// The first registration, the default ring and its mailbox, fails.
			require.Contains(t, err.Error(), fmt.Sprintf("register %d-byte receive ring", DefaultRingSize+mailboxSize))
			want := "RLIMIT_MEMLOCK unlimited"
			if binds {
				want = "RLIMIT_MEMLOCK 67108864"
			}
			require.Contains(t, err.Error(), want)
			require.Contains(t, err.Error(), "raise it (ulimit -l")
			requireReleased(t, f)
		})
	}
}

// TestCapEffHas reads CAP_IPC_LOCK out of /proc/self/status texts.
func TestCapEffHas(t *testing.T) {
	tests := []struct {
		status string
		want   bool
	}{
		{"Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n", true},
		{"CapEff:\t0000000000004000\n", true},
		{"CapEff:\t0000000000000000\n", false},
		{"CapPrm:\t0000000000004000\nCapEff:\t0000000000000000\n", false},
		{"CapEff:\tnot hex\n", false},
		{"Name:\tno caps line\n", false},
		{"", false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, capEffHas(strings.NewReader(tt.status), capIPCLock), "%q", tt.status)
	}
}

// pinningFake is the fake provider made to say whether it pins what it registers.
type pinningFake struct {
	*fakeProvider
	pins bool
}

func (p *pinningFake) PinsMemory() bool { return p.pins }

// TestRegisteredMemoryOnFake prepares endpoints on the fake provider until a limit
// stops them: Options.MaxRegisteredMemory on any provider, RLIMIT_MEMLOCK only on one
// that pins and only where the limit binds; a registration failing with the kernel's
// ENOMEM is reported as ErrMemlock. Abort gives the memory back, so the next Prepare
// fits again, and at the end nothing is counted as registered or pinned.
func TestRegisteredMemoryOnFake(t *testing.T) {
	const ringMR = 16<<10 + mailboxSize
	const perConn = ringMR + 8<<10
	page := os.Getpagesize()
	pinnedPerConn := (ringMR+page-1)/page*page + (8<<10+page-1)/page*page
	opts := Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: 8 << 10}
	enomem := fmt.Errorf("fake: reg mr: %w: %w", verbs.ErrNoResources, syscall.ENOMEM)
	tests := []struct {
		name     string
		pins     bool
		budget   int64
		memlock  uint64
		binds    bool
		says     bool  // implements PinsMemory, saying pins
		regErr   error // registrations fail with it after fit endpoints
		fit      int
		wantErr  error
		wantText string
	}{
		{name: "budget", budget: 2 * perConn, fit: 2, wantErr: ErrMemoryBudget, wantText: "(MaxRegisteredMemory)"},
		{name: "memlock", pins: true, memlock: uint64(2 * pinnedPerConn), binds: true, fit: 2,
			wantErr: ErrMemlock, wantText: "over RLIMIT_MEMLOCK"},
		{name: "memlock with CAP_IPC_LOCK", pins: true, budget: 3 * perConn, memlock: uint64(pinnedPerConn), fit: 3,
			wantErr: ErrMemoryBudget, wantText: "over the budget"},
		{name: "memlock, said not to pin", says: true, budget: 3 * perConn, memlock: uint64(pinnedPerConn), binds: true, fit: 3,
			wantErr: ErrMemoryBudget, wantText: "over the budget"},
		{name: "memlock without pinning", budget: 3 * perConn, memlock: uint64(pinnedPerConn), binds: true, fit: 3,
			wantErr: ErrMemoryBudget, wantText: "over the budget"},
		{name: "ENOMEM", pins: true, memlock: 64 << 20, binds: true, regErr: enomem, fit: 1,
			wantErr: syscall.ENOMEM, wantText: "RLIMIT_MEMLOCK 67108864"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			closeIdleAll(t) // what is pinned is counted over every device
			setMemlock(t, tt.memlock, tt.binds)
			fp := newFakeProvider()
			var p verbs.Provider = fp
			if tt.pins || tt.says {
				p = &pinningFake{fp, tt.pins}
			}
			o := opts
			o.MaxRegisteredMemory = tt.budget
			_, pinned0 := RegisteredMemory()
			var eps []*Endpoint
			for range tt.fit {
				ep, err := Prepare(p, loopback, o)
				require.NoError(t, err)
				eps = append(eps, ep)
			}
			dev := eps[0].dev
			require.EqualValues(t, tt.fit*perConn, registeredOn(eps[0]))
			fp.failAt("mr", tt.regErr)
			_, err := Prepare(p, loopback, o)
			require.ErrorIs(t, err, tt.wantErr)
			require.ErrorContains(t, err, tt.wantText)
			if tt.regErr != nil {
				require.ErrorIs(t, err, ErrMemlock)
			}
			require.EqualValues(t, tt.fit*perConn, registeredOn(eps[0]), "a refused endpoint holds nothing")
			fp.failAt("mr", nil)

			require.NoError(t, eps[0].Abort())
			eps[0], err = Prepare(p, loopback, o)
			require.NoError(t, err, "room again after Abort")
			for _, ep := range eps {
				require.NoError(t, ep.Abort())
			}
			require.NoError(t, CloseIdle(p))
			requireFakeReleased(t, fp)
			registered.Lock()
			_, left := registered.byDevice[dev]
			registered.Unlock()
			_, pinned := RegisteredMemory()
			require.False(t, left, "registrations left on the device")
			require.Equal(t, pinned0, pinned, "pinned bytes back to the baseline")
		})
	}
}

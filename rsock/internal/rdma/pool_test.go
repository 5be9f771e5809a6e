package rdma

import (
	"io"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// pooled is how many shells d's pool holds.
func pooled(d *device) int {
	devices.Lock()
	defer devices.Unlock()
	return len(d.shells)
}

// requireNoRegistrations fails unless nothing is counted as registered on d.
func requireNoRegistrations(t *testing.T, d *device) {
	t.Helper()
	registered.Lock()
	n, left := registered.byDevice[d]
	registered.Unlock()
	require.False(t, left, "%d bytes still counted as registered on the device", n)
}

// TestPoolReusesShell: an endpoint prepared after one of the same sizes was released
// takes its PD, ring and send buffer (the soft fabric's live PDs and MRs stay put, and
// the PD is the same), and one of other sizes allocates its own.
func TestPoolReusesShell(t *testing.T) {
	first := Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: 8 << 10}
	tests := []struct {
		name   string
		second Options
		reuse  bool
	}{
		{"same sizes", first, true},
		{"same sizes, other queue depths", Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: 8 << 10, RecvWQEs: 32, SendWQEs: 32}, true},
		{"other ring", Options{RingSize: 32 << 10, GrowRingTo: -1, SendBufferSize: 8 << 10}, false},
		{"other send buffer", Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: 16 << 10}, false},
		// A growing ring's first staging buffer is half its first ring: the same 8 KiB.
		{"growing ring of the same first sizes", Options{RingSize: 16 << 10, GrowRingTo: 64 << 10, SendBufferSize: 64 << 10}, true},
		{"growing ring of another first send buffer", Options{RingSize: 16 << 10, GrowRingTo: 64 << 10, SendBufferSize: 4 << 10}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			ep, err := Prepare(f, loopback, first)
			require.NoError(t, err)
			pd, dev := ep.pd, ep.dev
			require.NoError(t, ep.Abort())
			require.Equal(t, 1, pooled(dev), "shells pooled after Abort")
			before := f.Stats()
			require.Equal(t, soft.Stats{Contexts: 1, PDs: 1, MRs: 2, CQs: 1, CompChannels: 1}, before, "idle with one shell")

			ep, err = Prepare(f, loopback, tt.second)
			require.NoError(t, err)
			after := f.Stats()
			if tt.reuse {
				require.True(t, ep.pd == pd, "the pooled PD is reused")
				require.Equal(t, before.PDs, after.PDs, "PDs allocated by the second endpoint: %+v", after)
				require.Equal(t, before.MRs, after.MRs, "MRs registered by the second endpoint: %+v", after)
				require.Zero(t, pooled(dev), "shells left in the pool")
			} else {
				require.False(t, ep.pd == pd, "a shell of other sizes is reused")
				require.Equal(t, before.PDs+1, after.PDs, "PDs with the second endpoint: %+v", after)
				require.Equal(t, before.MRs+2, after.MRs, "MRs with the second endpoint: %+v", after)
				require.Equal(t, 1, pooled(dev), "the shell of other sizes stays pooled")
			}
			require.Equal(t, 1, after.QPs, "the second endpoint's QP: %+v", after)
			require.NoError(t, ep.Abort())
			requireReleased(t, f)
			requireNoRegistrations(t, dev)
		})
	}
}

// TestPoolClearsShell: what the previous endpoint left in its ring, mailbox and send
// buffer is gone when the next one takes them.
func TestPoolClearsShell(t *testing.T) {
	f := soft.New(soft.Options{})
	opts := Options{RingSize: 4 << 10, GrowRingTo: -1, SendBufferSize: 4 << 10}
	ep, err := Prepare(f, loopback, opts)
	require.NoError(t, err)
	for _, mr := range []verbs.MR{ep.ring, ep.sendBuf} {
		b := mr.Bytes()
		for i := range b {
			b[i] = byte(i) | 1
		}
	}
	pd := ep.pd
	require.NoError(t, ep.Abort())
	ep, err = Prepare(f, loopback, opts)
	require.NoError(t, err)
	require.True(t, ep.pd == pd, "the shell was not reused")
	for _, r := range []struct {
		what string
		b    []byte
	}{
		{"ring", ep.ring.Bytes()[:opts.RingSize]},
		{"mailbox", ep.ring.Bytes()[opts.RingSize:]},
		{"send buffer", ep.sendBuf.Bytes()},
	} {
		require.Len(t, r.b, map[string]int{"ring": 4 << 10, "mailbox": mailboxSize, "send buffer": 4 << 10}[r.what], r.what)
		for i, c := range r.b {
			if c != 0 {
				t.Fatalf("%s byte %d of the reused shell = %#x, want 0", r.what, i, c)
			}
		}
	}
	require.NoError(t, ep.Abort())
	requireReleased(t, f)
}

// TestPoolAcrossConnections connects, streams and closes pairs one after another on one
// fabric: from the second pair on, both ends take pooled shells (no PD or MR is
// allocated beyond the first pair's), and every pair's bytes arrive intact. A pair whose
// rings or staging grew pools nothing: its regions are not the first ones.
func TestPoolAcrossConnections(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		size       int // bytes a streams to b
		wantPooled int // shells pooled after each pair closes
	}{
		{"fixed rings", Options{RingSize: 4 << 10, GrowRingTo: -1, SendBufferSize: 4 << 10}, 256 << 10, 2},
		{"growing rings, small stream", Options{RingSize: 4 << 10, GrowRingTo: 64 << 10, SendBufferSize: 16 << 10}, 1 << 10, 2},
		{"growing rings, grown", Options{RingSize: 4 << 10, GrowRingTo: 64 << 10, SendBufferSize: 16 << 10}, 4 << 20, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			var peak soft.Stats
			for i := range 3 {
				a, b := connPair(t, f, tt.opts)
				dev := a.ep.dev
				s := f.Stats()
				if i == 0 {
					peak = s
				} else if tt.wantPooled == 2 {
					require.Equal(t, peak.PDs, s.PDs, "pair %d: PDs", i)
					require.Equal(t, peak.MRs, s.MRs, "pair %d: MRs", i)
				}
				sendAll(t, a, b, payload(tt.size, byte(i)), 32<<10, uint64(i))
				require.NoError(t, a.Close())
				require.NoError(t, b.Close())
				require.Equal(t, tt.wantPooled, pooled(dev), "pair %d: shells pooled", i)
				require.Zero(t, f.Stats().QPs, "pair %d: QPs left", i)
			}
			requireReleased(t, f)
		})
	}
}

// TestPoolBounded: a device pools at most maxPooledShells shells, and closes the rest.
func TestPoolBounded(t *testing.T) {
	f := soft.New(soft.Options{})
	var eps []*Endpoint
	for range maxPooledShells + 3 {
		ep, err := Prepare(f, loopback, Options{})
		require.NoError(t, err)
		eps = append(eps, ep)
	}
	dev := eps[0].dev
	for _, ep := range eps {
		require.NoError(t, ep.Abort())
	}
	require.Equal(t, maxPooledShells, pooled(dev))
	s := f.Stats()
	require.Equal(t, maxPooledShells, s.PDs, "PDs: %+v", s)
	require.Equal(t, 2*maxPooledShells, s.MRs, "MRs: %+v", s)
	perShell := int64(keyFor(Options{}.withDefaults()).ring + keyFor(Options{}.withDefaults()).send)
	registered.Lock()
	used := registered.byDevice[dev]
	registered.Unlock()
	require.Equal(t, maxPooledShells*perShell, used, "pooled shells stay counted as registered")
	requireReleased(t, f)
	requireNoRegistrations(t, dev)
}

// TestPoolEmptiesWhenDeviceCloses: however the device closes, its pooled shells' MRs
// and PDs are freed and their registered bytes uncounted.
func TestPoolEmptiesWhenDeviceCloses(t *testing.T) {
	tests := []struct {
		name  string
		close func(t *testing.T, p verbs.Provider, inUse *Endpoint)
	}{
		{"CloseIdle", func(t *testing.T, p verbs.Provider, inUse *Endpoint) {
			require.NoError(t, inUse.Abort())
			require.NoError(t, CloseIdle(p))
		}},
		{"Cool while in use", func(t *testing.T, p verbs.Provider, inUse *Endpoint) {
			require.NoError(t, Cool(p))
			require.NoError(t, inUse.Abort()) // the last endpoint closes the cooled device
		}},
		{"fatal event", func(t *testing.T, p verbs.Provider, inUse *Endpoint) {
			inUse.dev.handleEvent(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
			require.NoError(t, inUse.Abort()) // a failed device does not idle
		}},
		{"idle timeout", func(t *testing.T, p verbs.Provider, inUse *Endpoint) {
			require.NoError(t, inUse.Abort())
			time.Sleep(deviceIdleTimeout)
			synctest.Wait()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := soft.New(soft.Options{})
				p := &provider{Fabric: f}
				var eps []*Endpoint
				for range 3 {
					ep, err := Prepare(p, loopback, Options{})
					require.NoError(t, err)
					eps = append(eps, ep)
				}
				dev := eps[0].dev
				require.NoError(t, eps[1].Abort())
				require.NoError(t, eps[2].Abort())
				require.Equal(t, 2, pooled(dev))
				tt.close(t, p, eps[0])
				requireReleasedNow(t, f)
				requireNoRegistrations(t, dev)
				require.Zero(t, pooled(dev))
			})
		})
	}
}

// TestPoolKeepsLimits: with shells pooled, Options.MaxRegisteredMemory, RLIMIT_MEMLOCK
// and Options.Budget admit exactly the endpoints they admit without a pool: pooled
// shells that hold the memory a registration needs are closed for it, a shell is not
// reused past a budget that registering afresh would pass, and Options.Budget is
// charged for a reused shell as for a new one.
func TestPoolKeepsLimits(t *testing.T) {
	small := Options{RingSize: 16 << 10, GrowRingTo: -1, SendBufferSize: 8 << 10}
	large := Options{RingSize: 32 << 10, GrowRingTo: -1, SendBufferSize: 8 << 10}
	perConn := func(o Options) int { k := keyFor(o.withDefaults()); return k.ring + k.send }
	page := os.Getpagesize()
	pinned := func(o Options) uint64 {
		k := keyFor(o.withDefaults())
		return uint64((k.ring+page-1)/page*page + (k.send+page-1)/page*page)
	}
	tests := []struct {
		name    string
		pins    bool
		memlock uint64
		set     func(o *Options, b *budget) // the limit, for the endpoints after the pooled ones
		next    Options                     // the sizes of those endpoints
		fit     int                         // how many fit without a pool
		wantErr error
	}{
		{"budget, same sizes", false, 0, func(o *Options, _ *budget) { o.MaxRegisteredMemory = int64(3 * perConn(small)) }, small, 3, ErrMemoryBudget},
		{"budget, other sizes", false, 0, func(o *Options, _ *budget) { o.MaxRegisteredMemory = int64(3 * perConn(large)) }, large, 3, ErrMemoryBudget},
		{"budget below the pooled memory", false, 0, func(o *Options, _ *budget) { o.MaxRegisteredMemory = int64(perConn(small)) }, small, 1, ErrMemoryBudget},
		{"memlock, other sizes", true, 2 * pinned(large), func(*Options, *budget) {}, large, 2, ErrMemlock},
		{"Options.Budget, same sizes", false, 0, func(o *Options, b *budget) {
			*b = budget{maxQPs: 100, maxBytes: 2 * perConn(small)}
			o.Budget = b
		}, small, 2, errOverBudget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			closeIdleAll(t) // no other device's pool in what is pinned
			f := soft.New(soft.Options{})
			var p verbs.Provider = f
			if tt.pins {
				p = &pinningProvider{Fabric: f}
			}
			// Four shells of small, pooled without any limit.
			var eps []*Endpoint
			for range 4 {
				ep, err := Prepare(p, loopback, small)
				require.NoError(t, err)
				eps = append(eps, ep)
			}
			dev := eps[0].dev
			for _, ep := range eps {
				require.NoError(t, ep.Abort())
			}
			require.Equal(t, 4, pooled(dev))
			setMemlock(t, tt.memlock, tt.memlock > 0) // after the pooling, which it would refuse

			o, b := tt.next, &budget{}
			tt.set(&o, b)
			eps = eps[:0]
			for i := range tt.fit {
				ep, err := Prepare(p, loopback, o)
				require.NoError(t, err, "endpoint %d of the %d that fit without a pool", i, tt.fit)
				eps = append(eps, ep)
			}
			_, err := Prepare(p, loopback, o)
			require.ErrorIs(t, err, tt.wantErr, "endpoint %d, beyond what fits", tt.fit)
			if o.Budget != nil {
				qps, bytes := b.held()
				require.Equal(t, tt.fit, qps, "queue pairs charged")
				require.Equal(t, tt.fit*perConn(o), bytes, "bytes charged")
			}
			for _, ep := range eps {
				require.NoError(t, ep.Abort())
			}
			if o.Budget != nil {
				qps, bytes := b.held()
				require.Zero(t, qps+bytes, "charged to Options.Budget after every Abort")
			}
			requireReleased(t, f)
			requireNoRegistrations(t, dev)
		})
	}
}

// enteredReader signals entered when its first Read begins, then reads r.
type enteredReader struct {
	r       io.Reader
	entered chan struct{}
	once    sync.Once
}

func (e *enteredReader) Read(p []byte) (int, error) {
	e.once.Do(func() { close(e.entered) })
	return e.r.Read(p)
}

// TestCloseLeavesLentStage: a Conn closed while a ReadFrom is reading into its staging
// buffer leaves the endpoint, staging included, registered until that Read returns:
// neither freed (some providers unmap it) nor pooled (another connection would take
// it) under the Read. Then it is released, and pooled.
func TestCloseLeavesLentStage(t *testing.T) {
	f := soft.New(soft.Options{})
	opts := Options{RingSize: 4 << 10, GrowRingTo: -1, SendBufferSize: 4 << 10, Linger: -1}
	a, b := connPair(t, f, opts)
	dev := a.ep.dev
	pr, pw := io.Pipe()
	r := &enteredReader{r: pr, entered: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := a.ReadFrom(r)
		done <- err
	}()
	<-r.entered
	a.mu.Lock()
	lent := a.stageLent
	a.mu.Unlock()
	require.True(t, lent, "staging lent while ReadFrom reads")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.Equal(t, 1, pooled(dev), "the peer's shell")
	s := f.Stats()
	require.Equal(t, 2, s.PDs, "PDs: the peer's pooled, and ours under the Read: %+v", s)
	require.Equal(t, 4, s.MRs, "MRs: the peer's pooled ring and staging, and ours under the Read: %+v", s)
	pw.Close() // the Read ends with io.EOF and nothing to post: ReadFrom reports nil
	require.NoError(t, <-done)
	require.Equal(t, 2, pooled(dev), "ours, released as the Read ended")
	requireReleased(t, f)
}

// opaqueProvider is a provider that does not say it keeps regions behind their PD's
// QPs (qpIsolator), as verbs/shm, whose peers map the regions themselves.
type opaqueProvider struct{ verbs.Provider }

// TestPoolOnlyWhereQPsIsolate: on a provider that does not say its regions are reached
// only through their PD's QPs, a released endpoint's PD and regions are freed, not
// pooled, and the next endpoint allocates its own.
func TestPoolOnlyWhereQPsIsolate(t *testing.T) {
	f := soft.New(soft.Options{})
	p := &opaqueProvider{Provider: f}
	ep, err := Prepare(p, loopback, Options{})
	require.NoError(t, err)
	dev, pd := ep.dev, ep.pd
	require.NoError(t, ep.Abort())
	require.Zero(t, pooled(dev), "shells pooled")
	s := f.Stats()
	require.Zero(t, s.PDs+s.MRs, "PDs and MRs after Abort: %+v", s)
	ep, err = Prepare(p, loopback, Options{})
	require.NoError(t, err)
	require.False(t, ep.pd == pd, "the PD was reused")
	require.NoError(t, ep.Abort())
	require.NoError(t, CloseIdle(p))
	requireReleasedNow(t, f)
}

// TestPoolShellConditions: an endpoint released with anything but its first ring and
// staging buffer in its PD, or with a ReadFrom reading into its staging, is freed, not
// pooled; every case leaves nothing behind once the device closes.
func TestPoolShellConditions(t *testing.T) {
	extra := func(t *testing.T, ep *Endpoint) verbs.MR {
		mr, err := ep.registerMR(4<<10, ringAccess, "test region")
		require.NoError(t, err)
		return mr
	}
	tests := []struct {
		name   string
		mutate func(t *testing.T, ep *Endpoint)
		pooled int
	}{
		{"untouched", func(*testing.T, *Endpoint) {}, 1},
		{"ring switched, old ring held", func(t *testing.T, ep *Endpoint) { ep.oldRing, ep.ring = ep.ring, extra(t, ep) }, 0},
		{"ring announced", func(t *testing.T, ep *Endpoint) { ep.nextRing = extra(t, ep) }, 0},
		{"staging grown, old staging held", func(t *testing.T, ep *Endpoint) { ep.oldSend, ep.sendBuf = ep.sendBuf, extra(t, ep) }, 0},
		{"a region failed to deregister", func(_ *testing.T, ep *Endpoint) { ep.dirty = true }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			ep, err := Prepare(f, loopback, Options{})
			require.NoError(t, err)
			dev := ep.dev
			tt.mutate(t, ep)
			require.NoError(t, ep.Abort())
			require.Equal(t, tt.pooled, pooled(dev), "shells pooled")
			s := f.Stats()
			require.Equal(t, tt.pooled, s.PDs, "PDs left: %+v", s)
			require.Equal(t, 2*tt.pooled, s.MRs, "MRs left: %+v", s)
			requireReleased(t, f)
			requireNoRegistrations(t, dev)
		})
	}
}

// BenchmarkPrepare prepares and aborts endpoints with the defaults on a warm soft
// device: "pooled" takes the previous endpoint's shell, "unpooled" (soft behind a
// provider that does not say it isolates regions by QP) allocates a PD and registers
// a ring and a staging buffer each time, as before the pool.
func BenchmarkPrepare(b *testing.B) {
	for _, bm := range []struct {
		name string
		p    func(*soft.Fabric) verbs.Provider
	}{
		{"pooled", func(f *soft.Fabric) verbs.Provider { return f }},
		{"unpooled", func(f *soft.Fabric) verbs.Provider { return &opaqueProvider{Provider: f} }},
	} {
		b.Run(bm.name, func(b *testing.B) {
			f := soft.New(soft.Options{})
			p := bm.p(f)
			b.Cleanup(func() { CloseIdle(p) })
			b.ReportAllocs()
			for b.Loop() {
				ep, err := Prepare(p, loopback, Options{})
				if err != nil {
					b.Fatal(err)
				}
				if err := ep.Abort(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package rdma

import (
	"bytes"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
	"github.com/rsockio/rsock/verbs/soft"
)

// payload is n bytes of a seeded random stream.
func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

// sendAll writes p in chunks of random sizes up to max, on its own goroutine, and
// reads it back on the other side, checking every byte.
func sendAll(t *testing.T, w, r *Conn, p []byte, maxChunk int, seed uint64) {
	t.Helper()
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 1))
		for off := 0; off < len(p); {
			n := min(1+rng.IntN(maxChunk), len(p)-off)
			if _, werr = w.Write(p[off : off+n]); werr != nil {
				return
			}
			off += n
		}
	})
	got := make([]byte, len(p))
	_, err := io.ReadFull(r, got)
	wg.Wait()
	require.NoError(t, werr)
	require.NoError(t, err)
	require.True(t, bytes.Equal(p, got), "bytes differ")
}

// ringState is a Conn's ring as its flow control and engine see it.
type ringState struct {
	size, switches int
	old            bool // an old ring is still held
	growErr        error
}

func ringOf(c *Conn) ringState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ringState{size: c.fc.RingSize(), switches: int(c.ringSwitches), old: c.oldRing != nil || c.ep.oldRing != nil, growErr: c.growErr}
}

// pingPong sends a byte each way and reads it: every message either side posted before
// has then been reaped by the other (a connection delivers in order), so a resize and
// the switch answering it are done.
func pingPong(t *testing.T, a, b *Conn) {
	t.Helper()
	for _, pair := range [][2]*Conn{{b, a}, {a, b}} {
		_, err := pair[0].Write([]byte{'p'})
		require.NoError(t, err)
		_, err = io.ReadFull(pair[1], make([]byte, 1))
		require.NoError(t, err)
	}
}

// TestRingGrows streams through rings that start at 4 KiB and may grow to 64 KiB, one
// way and both ways at once: the receiving rings grow (4 to 16 to 64 KiB) and the
// writers' staging buffers (2 to 8 to 16 KiB), every byte arrives in order, the replaced
// rings and buffers are freed, and what the device holds is what the grown ones need.
// It runs on soft and, where this build has one and the machine a device (built with
// -tags rdma, in the Soft-RoCE VM), on the default provider.
func TestRingGrows(t *testing.T) {
	const size = 4 << 20
	opts := Options{RingSize: 4 << 10, GrowRingTo: 64 << 10, SendBufferSize: 16 << 10, NoPlacement: true} // registered memory: the rings and staging alone
	perEnd := func(ring, stage int) int64 { return int64(ring + mailboxSize + stage) }
	type prov struct {
		name string
		p    verbs.Provider
		f    *soft.Fabric // for the release check, or nil
	}
	provs := []prov{{"soft", nil, nil}}
	if p, err := auto.Default(); err == nil {
		provs = append(provs, prov{"default-" + p.Name(), p, nil})
	} else {
		t.Logf("no default provider here, soft only: %v", err)
	}
	for _, pv := range provs {
		fresh := func() prov {
			if pv.p != nil {
				return pv
			}
			f := soft.New(soft.Options{})
			return prov{pv.name, f, f}
		}
		released := func(t *testing.T, pv prov) {
			if pv.f != nil {
				requireReleased(t, pv.f)
			}
		}
		t.Run(pv.name+"/one way", func(t *testing.T) {
			pv := fresh()
			closeIdleAll(t)                 // no device's pooled shells (pool.go) for connPair to take
			before, _ := RegisteredMemory() // the process's, over every device
			a, b := connPair(t, pv.p, opts)
			require.Equal(t, ringState{size: 4 << 10}, ringOf(b))
			sendAll(t, a, b, payload(size, 1), 32<<10, 1)
			require.Equal(t, ringState{size: 64 << 10, switches: 2}, ringOf(b))
			require.Equal(t, ringState{size: 4 << 10}, ringOf(a), "a received nothing but credit")
			// The writer's staging grew (2 KiB, 8, 16), the reader's did not.
			after, _ := RegisteredMemory()
			require.Equal(t, perEnd(4<<10, 16<<10)+perEnd(64<<10, 2<<10), after-before, "registered: both ends' grown memory, nothing replaced")
			require.NoError(t, a.Close())
			require.NoError(t, b.Close())
			released(t, pv)
		})
		t.Run(pv.name+"/both ways", func(t *testing.T) {
			pv := fresh()
			a, b := connPair(t, pv.p, opts)
			var wg sync.WaitGroup
			wg.Go(func() { sendAll(t, a, b, payload(size, 2), 20<<10, 2) })
			sendAll(t, b, a, payload(size, 3), 20<<10, 3)
			wg.Wait()
			for _, c := range []*Conn{a, b} {
				r := ringOf(c)
				require.Equal(t, 64<<10, r.size)
				require.False(t, r.old, "old ring freed")
			}
			require.NoError(t, a.Close())
			require.NoError(t, b.Close())
			released(t, pv)
		})
	}
}

// TestRingShrinksWhenIdle: a grown ring goes back to its first size at the second
// keepalive tick without data, and the stream goes on through it.
func TestRingShrinksWhenIdle(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{RingSize: 4 << 10, GrowRingTo: 16 << 10})
	sendAll(t, a, b, payload(1<<20, 4), 8<<10, 4)
	require.Equal(t, 16<<10, ringOf(b).size)
	tick := func() {
		b.mu.Lock()
		b.idleShrinkLocked()
		b.mu.Unlock()
	}
	tick() // data arrived since the last tick: no shrink
	pingPong(t, a, b)
	require.Equal(t, 16<<10, ringOf(b).size)
	tick() // the ping arrived since
	tick() // idle now: shrink
	pingPong(t, a, b)
	require.Equal(t, ringState{size: 4 << 10, switches: 2}, ringOf(b))
	sendAll(t, a, b, payload(256<<10, 5), 3<<10, 5)
	require.Equal(t, 16<<10, ringOf(b).size, "grown again")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestStagingShrinksWhenIdle: a staging buffer a stream grew goes back to its first
// size at the second keepalive tick with nothing staged, once its sends completed, and
// grows again for the next stream; every byte arrives, and nothing registered is left.
func TestStagingShrinksWhenIdle(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{RingSize: 4 << 10, GrowRingTo: 64 << 10, SendBufferSize: 32 << 10})
	stage := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.stage)
	}
	// tick is sendKeepalive's part that matters here: a signaled probe, whose
	// completion retires every staged send before it, then the idle check.
	tick := func() {
		a.mu.Lock()
		a.fillProbeWR(0)
		a.wrEnd[0] = a.stageTail
		require.NoError(t, a.postLocked(1))
		posted := a.sqPosted
		a.mu.Unlock()
		require.Eventually(t, func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.sqDone >= posted
		}, 10*time.Second, time.Millisecond, "the probe completes")
		a.mu.Lock()
		a.idleShrinkStageLocked()
		a.mu.Unlock()
	}
	sendAll(t, a, b, payload(1<<20, 6), 8<<10, 6)
	require.Equal(t, 32<<10, stage(), "grown")
	tick() // staged since the last tick: no shrink
	require.Equal(t, 32<<10, stage())
	tick() // idle now: shrink
	require.Equal(t, 2<<10, stage(), "back to half the first ring")
	sendAll(t, a, b, payload(512<<10, 7), 8<<10, 7)
	require.Equal(t, 32<<10, stage(), "grown again")
	pingPong(t, a, b)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestRingGrowsWhileNotRead: the reader does not read while 1 MiB arrives; the ring
// grows with its old bytes still unread, and the spill takes them out of the old ring
// before the new: everything is read back in order.
func TestRingGrowsWhileNotRead(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{RingSize: 4 << 10, GrowRingTo: 64 << 10})
	p := payload(1<<20, 6)
	_, err := a.Write(p) // returns once the peer has buffered (spilled) it all
	require.NoError(t, err)
	got := make([]byte, len(p))
	_, err = io.ReadFull(b, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(p, got), "bytes differ")
	r := ringOf(b)
	require.Equal(t, 64<<10, r.size)
	require.False(t, r.old)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// growUnread writes p from a to b, on its own goroutine, while b does not read, until
// b's ring is want bytes, then reads it all back and checks it. A ring whose reader
// does not read fills, and grows, at every step, where one raced by its reader grows
// past 512 KiB only when the scheduler lets the writer get ahead (maybeGrowLocked).
func growUnread(t *testing.T, a, b *Conn, p []byte, want int) {
	t.Helper()
	wrote := make(chan error, 1)
	go func() {
		_, err := a.Write(p)
		wrote <- err
	}()
	require.Eventually(t, func() bool { return ringOf(b).size == want }, 30*time.Second, time.Millisecond,
		"b's ring never reached %d bytes", want)
	got := make([]byte, len(p))
	_, err := io.ReadFull(b, got)
	require.NoError(t, err)
	require.NoError(t, <-wrote)
	require.True(t, bytes.Equal(p, got), "bytes differ")
}

// TestRingGrowsPastLegacyUnit: a ring grows past 512 KiB, where a ring's own credit
// unit would change, because both offers name the unit ring it keeps (8 bytes, 4 MiB's),
// and every byte arrives in order. Toward a peer whose offer names none (an rsock from
// before this), the same ring stops at 512 KiB, the last ring of a 1-byte unit, and the
// stream is just as whole.
func TestRingGrowsPastLegacyUnit(t *testing.T) {
	const growTo = 4 << 20
	for _, tt := range []struct {
		name   string
		legacy bool // the offers name no unit ring
		want   int
	}{
		{"both offers name the unit ring", false, growTo},
		{"a peer that names none", true, legacyUnitRing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{})
			ca, cb := tcpPair(t)
			opts := Options{RingSize: 32 << 10, GrowRingTo: growTo}
			ea, err := Prepare(f, loopback, opts)
			require.NoError(t, err)
			eb, err := Prepare(f, loopback, opts)
			require.NoError(t, err)
			oa, ob := ea.Offer(), eb.Offer()
			require.Equal(t, uint32(growTo), oa.UnitRingSize, "our offer names the largest ring")
			if tt.legacy {
				oa.UnitRingSize, ob.UnitRingSize = 0, 0
			}
			a, err := ea.Connect(ob, ca, 0)
			require.NoError(t, err)
			b, err := eb.Connect(oa, cb, 0)
			require.NoError(t, err)
			startPair(t, a, b)

			growUnread(t, a, b, payload(12<<20, 8), tt.want)
			pingPong(t, a, b) // a resize after the last look is done
			r := ringOf(b)
			require.Equal(t, tt.want, r.size, "b's ring")
			require.NoError(t, r.growErr)
			require.NoError(t, a.Close())
			require.NoError(t, b.Close())
			requireReleased(t, f)
		})
	}
}

// TestRingGrowthHeadroom: on a provider that pins, under a binding RLIMIT_MEMLOCK of
// 8 MiB, a ring grows past 512 KiB only while the process pins at most half of it: the
// stream's ring stops at 2 MiB (4 MiB would pass 4 MiB pinned), growth stops without an
// error, and a connection prepared after it still fits.
func TestRingGrowthHeadroom(t *testing.T) {
	closeIdleAll(t)
	setMemlock(t, 8<<20, true)
	p := &pinningProvider{Fabric: soft.New(soft.Options{})}
	opts := Options{RingSize: 32 << 10, GrowRingTo: 4 << 20}
	a, b := connPair(t, p, opts)
	growUnread(t, a, b, payload(12<<20, 9), 2<<20)
	pingPong(t, a, b)
	r := ringOf(b)
	require.Equal(t, 2<<20, r.size, "b's ring")
	require.NoError(t, r.growErr)
	_, pinned := RegisteredMemory()
	require.LessOrEqual(t, pinned, int64(4<<20), "pinned by the two ends")

	ep, err := Prepare(p, loopback, opts)
	require.NoError(t, err, "a connection prepared after the stream")
	require.NoError(t, ep.Abort())
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, p.Fabric)
}

// TestRingGrowthOverBudget: a ring that would pass MaxRegisteredMemory is not grown;
// the connection goes on with the ring it has, and says why. Idle, that ring still
// shrinks back to the first, and a stream grows it again to the size it reached.
func TestRingGrowthOverBudget(t *testing.T) {
	f := soft.New(soft.Options{})
	opts := Options{RingSize: 4 << 10, GrowRingTo: 64 << 10, SendBufferSize: 4 << 10}
	opts.MaxRegisteredMemory = 2*int64(opts.RingSize+mailboxSize+opts.SendBufferSize) + 20<<10 // room for one 16 KiB ring
	a, b := connPair(t, f, opts)
	sendAll(t, a, b, payload(2<<20, 7), 16<<10, 7)
	r := ringOf(b)
	require.Equal(t, 16<<10, r.size, "grown once, not to 64 KiB")
	require.ErrorIs(t, r.growErr, ErrMemoryBudget)
	tick := func() {
		b.mu.Lock()
		b.idleShrinkLocked()
		b.mu.Unlock()
	}
	tick() // data arrived since the last tick: no shrink
	tick() // idle now: shrink
	pingPong(t, a, b)
	require.Equal(t, 4<<10, ringOf(b).size, "shrunk when idle")
	sendAll(t, a, b, payload(1<<20, 8), 16<<10, 8)
	require.Equal(t, 16<<10, ringOf(b).size, "grown back to the ring it had")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, f)
}

// TestGrowRingToValidated: the largest ring must be a power of two from RingSize to
// MaxRingSize.
func TestGrowRingToValidated(t *testing.T) {
	tests := []struct {
		ring, grow int
		ok         bool
	}{
		{4 << 10, 0, true},
		{4 << 10, -1, true},
		{256 << 10, 0, true},
		{256 << 10, -1, true},
		{4 << 10, 4 << 10, true},
		{4 << 10, 512 << 10, true},
		{4 << 10, 1 << 20, true},
		{4 << 10, MaxRingSize, true},
		{4 << 10, 2 * MaxRingSize, false},
		{16 << 10, 8 << 10, false},
		{4 << 10, 48 << 10, false},
	}
	for _, tt := range tests {
		err := Options{RingSize: tt.ring, GrowRingTo: tt.grow}.withDefaults().validate()
		require.Equal(t, tt.ok, err == nil, "ring %d, grow to %d: %v", tt.ring, tt.grow, err)
	}
}

// TestRingDescRoundTrip: the resize's payload reads back as written.
func TestRingDescRoundTrip(t *testing.T) {
	b := make([]byte, mailboxSize)
	putRingDesc(b[mailboxOut:], 0x1122334455667788, 0xdeadbeef, 64<<10)
	addr, rkey, size := parseRingDesc(b[mailboxOut:])
	require.Equal(t, uint64(0x1122334455667788), addr)
	require.Equal(t, uint32(0xdeadbeef), rkey)
	require.Equal(t, uint32(64<<10), size)
}

// TestGrowthDefaults: rings grow by default, from 8 KiB to 4 MiB with 4 KiB of
// staging to start, growing to half the largest ring, 256 KiB at most, unless
// SendBufferSize says otherwise; a negative GrowRingTo, one equal to RingSize, or a RingSize of 128 KiB or
// more keeps a fixed ring and full staging, 64 KiB by default.
func TestGrowthDefaults(t *testing.T) {
	tests := []struct {
		name            string
		opts            Options
		ring, growTo    int
		grows           bool
		firstSendBuffer int
		sendBuffer      int
		pinnedSend      int // staging's growth on a provider that pins
	}{
		{"defaults", Options{}, 8 << 10, 4 << 20, true, 4 << 10, 256 << 10, 1 << 20},
		{"fixed by a negative GrowRingTo", Options{GrowRingTo: -5}, 8 << 10, -1, false, 64 << 10, 64 << 10, 0},
		{"fixed by GrowRingTo equal to RingSize", Options{RingSize: 16 << 10, GrowRingTo: 16 << 10}, 16 << 10, 16 << 10, false, 64 << 10, 64 << 10, 0},
		{"fixed by a large RingSize", Options{RingSize: 128 << 10}, 128 << 10, -1, false, 64 << 10, 64 << 10, 0},
		{"larger first ring grows to the default", Options{RingSize: 32 << 10}, 32 << 10, 4 << 20, true, 16 << 10, 256 << 10, 1 << 20},
		{"fixed ring below the default", Options{RingSize: 64 << 10, GrowRingTo: -1}, 64 << 10, -1, false, 64 << 10, 64 << 10, 0},
		{"smaller growth, staging follows", Options{GrowRingTo: 128 << 10}, 8 << 10, 128 << 10, true, 4 << 10, 64 << 10, 64 << 10},
		{"staging set", Options{SendBufferSize: 32 << 10}, 8 << 10, 4 << 20, true, 4 << 10, 32 << 10, 0},
		{"growth to 512 KiB, staging half of it", Options{GrowRingTo: 512 << 10}, 8 << 10, 512 << 10, true, 4 << 10, 256 << 10, 256 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.opts.withDefaults()
			require.NoError(t, o.validate())
			require.Equal(t, tt.ring, o.RingSize, "RingSize")
			require.Equal(t, tt.growTo, o.GrowRingTo, "GrowRingTo")
			require.Equal(t, tt.grows, o.grows(), "grows")
			require.Equal(t, tt.firstSendBuffer, o.firstSendBuffer(), "first send buffer")
			require.Equal(t, tt.sendBuffer, o.SendBufferSize, "SendBufferSize")
			require.Equal(t, tt.pinnedSend, o.pinnedSendBuffer, "pinnedSendBuffer")
			require.Equal(t, o, o.withDefaults(), "defaults applied twice")
		})
	}
}

// TestStageMaxPins: by default, staging grows to 1 MiB on a provider that pins memory
// (every Write under 1 MiB is staged there) and to 256 KiB on one that does not; a
// SendBufferSize the user set holds on both.
func TestStageMaxPins(t *testing.T) {
	f := soft.New(soft.Options{})
	tests := []struct {
		name string
		p    verbs.Provider
		opts Options
		want int
	}{
		{"soft, defaults", f, Options{}, 256 << 10},
		{"pinning, defaults", &pinningProvider{Fabric: f}, Options{}, 1 << 20},
		{"pinning, growth to 512 KiB", &pinningProvider{Fabric: f}, Options{GrowRingTo: 512 << 10}, 256 << 10},
		{"pinning, staging set", &pinningProvider{Fabric: f}, Options{SendBufferSize: 128 << 10}, 128 << 10},
		{"soft, staging set", f, Options{SendBufferSize: 2 << 20}, 2 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep, err := Prepare(tt.p, loopback, tt.opts)
			require.NoError(t, err)
			require.Equal(t, tt.want, ep.stageMax())
			require.NoError(t, ep.Abort())
		})
	}
	closeIdleAll(t)
	requireReleased(t, f)
}

// TestStagingGrowthHeadroom: on a provider that pins, a stream's staging grows to
// 1 MiB, but under a binding RLIMIT_MEMLOCK of 2 MiB it stops at 256 KiB, as rings
// past 512 KiB do, rather than pin more than half the limit; the stream goes on.
func TestStagingGrowthHeadroom(t *testing.T) {
	for _, tt := range []struct {
		name  string
		limit uint64
		binds bool
		want  int
	}{
		{"unbound", 0, false, 1 << 20},
		{"2 MiB", 2 << 20, true, 256 << 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			closeIdleAll(t)
			setMemlock(t, tt.limit, tt.binds)
			p := &pinningProvider{Fabric: soft.New(soft.Options{})}
			a, b := connPair(t, p, Options{})
			sendAll(t, a, b, payload(16<<20, 8), 64<<10, 8)
			a.mu.Lock()
			got := len(a.stage)
			a.mu.Unlock()
			require.Equal(t, tt.want, got, "the writer's staging")
			require.NoError(t, a.Close())
			require.NoError(t, b.Close())
			requireReleased(t, p.Fabric)
		})
	}
}

// TestFixedRingMeetsGrowingRing: an end with a fixed ring (GrowRingTo negative) and one
// that grows (to 512 KiB) stream both ways at once: the growing end's ring grows,
// announced through the fixed end's mailbox, which every ring has; the fixed one stays
// as it is, and every byte arrives in order.
func TestFixedRingMeetsGrowingRing(t *testing.T) {
	const size, growTo = 2 << 20, 512 << 10
	f := soft.New(soft.Options{})
	ca, cb := tcpPair(t)
	ea, err := Prepare(f, loopback, Options{RingSize: 16 << 10, GrowRingTo: -1})
	require.NoError(t, err)
	eb, err := Prepare(f, loopback, Options{GrowRingTo: growTo})
	require.NoError(t, err)
	fixed, err := ea.Connect(eb.Offer(), ca, 0)
	require.NoError(t, err)
	growing, err := eb.Connect(ea.Offer(), cb, 0)
	require.NoError(t, err)
	startPair(t, fixed, growing)

	var wg sync.WaitGroup
	wg.Go(func() { sendAll(t, fixed, growing, payload(size, 4), 20<<10, 4) })
	sendAll(t, growing, fixed, payload(size, 5), 20<<10, 5)
	wg.Wait()
	require.Equal(t, ringState{size: 16 << 10}, ringOf(fixed), "the fixed ring")
	g := ringOf(growing)
	require.Equal(t, growTo, g.size, "the growing ring")
	require.False(t, g.old, "old ring freed")
	require.NoError(t, fixed.Close())
	require.NoError(t, growing.Close())
	requireReleased(t, f)
}

// TestRingGrowsPast512KiBOnlyWhenFull: past 512 KiB a ring grows only when the peer
// holds three quarters of it, not because a stream has turned it over: a 512 KiB ring
// whose reader keeps up stays as it is after eight rings' worth, and grows to 2 MiB
// once its reader stops and the arrivals fill it.
func TestRingGrowsPast512KiBOnlyWhenFull(t *testing.T) {
	const ring, chunk = 512 << 10, 32 << 10
	p := newFakeProvider()
	c, _ := fakeConnPair(t, p, loopback, loopback, Options{RingSize: ring, GrowRingTo: 2 << 20, Linger: -1})
	q := &fakeQP{qpn: c.qp.QPN()}
	c.qp = q
	resizes := func() int {
		return len(slices.DeleteFunc(postedKinds(t, q), func(k flowctl.Kind) bool { return k != flowctl.KindResize }))
	}
	buf := make([]byte, chunk)
	wqe := uint64(0)
	for range 8 * ring / chunk { // each chunk read as it arrives
		arriveImm(t, c, wqe%fakeWQEs, flowctl.Imm{Kind: flowctl.KindData}, chunk)
		wqe++
		_, err := io.ReadFull(c, buf)
		require.NoError(t, err)
	}
	require.Zero(t, resizes(), "grown by turnover alone")
	require.Equal(t, ring, ringOf(c).size)

	c.mu.Lock()
	c.reading = true // a Read in progress: nothing spills, the peer holds what arrives
	c.mu.Unlock()
	for range 3 * ring / 4 / chunk {
		arriveImm(t, c, wqe%fakeWQEs, flowctl.Imm{Kind: flowctl.KindData}, chunk)
		wqe++
	}
	require.Equal(t, 1, resizes(), "grown once three quarters are held")
	c.mu.Lock()
	require.Equal(t, 2<<20, c.nextRingSize, "to 2 MiB")
	c.mu.Unlock()
	c.consume(0, 0, true) // the Read in progress ends
}

// resizingConn returns a Conn, prepared and connected on the fake provider, whose ring
// starts at 16 KiB and may grow to 64 KiB, with a recording fake QP in place of the
// provider's: the test plays the peer, handing it completions.
func resizingConn(t *testing.T) (*Conn, *fakeQP) {
	t.Helper()
	p := newFakeProvider()
	a, _ := fakeConnPair(t, p, loopback, loopback, Options{RingSize: 16 << 10, GrowRingTo: 64 << 10, Linger: -1})
	q := &fakeQP{qpn: a.qp.QPN()}
	a.qp = q
	return a, q
}

// arriveImm hands c the receive completion of a message with immediate m and byteLen
// bytes, on receive WQE wqe.
func arriveImm(t *testing.T, c *Conn, wqe uint64, m flowctl.Imm, byteLen int) {
	t.Helper()
	imm, err := m.Encode()
	require.NoError(t, err)
	c.onCompletion(&verbs.WorkCompletion{WRID: recvWRFlag | c.gen | wqe, Status: verbs.WCSuccess,
		Opcode: verbs.WCRecvRDMAWithImm, Flags: verbs.WCWithImm, Imm: imm, ByteLen: uint32(byteLen)})
}

// TestRingGrowsOnFake: arrivals that leave three quarters of the ring held grow it: a
// 64 KiB ring is registered and announced in a resize, which carries its description
// from behind it into the mailbox behind the peer's ring; at the peer's switch, data
// lands in the new ring, while the old one's bytes are read first, and the old ring is
// freed once they are.
func TestRingGrowsOnFake(t *testing.T) {
	const grown = 64 << 10
	c, q := resizingConn(t)
	c.mu.Lock()
	c.reading = true // a Read in progress: nothing spills, the peer holds what arrives
	c.mu.Unlock()
	chunk := streamBytes(11, 4<<10)
	for i := range 3 {
		copy(c.ring[i*len(chunk):], chunk)
		arriveImm(t, c, uint64(i), flowctl.Imm{Kind: flowctl.KindData}, len(chunk))
	}
	wrs := q.posted()
	require.Len(t, wrs, 1, "one resize")
	rs := wrs[0]
	m, err := flowctl.DecodeImm(rs.Imm, rs.SGL[0].Length)
	require.NoError(t, err)
	require.Equal(t, flowctl.KindResize, m.Kind)
	require.Equal(t, uint8(16), m.RingLog2, "a ring of 64 KiB announced")
	require.Equal(t, c.peerRingAddr+uint64(c.fc.PeerRingSize())+mailboxIn, rs.RemoteAddr, "into the peer's mailbox")
	next := c.ep.nextRing
	require.NotNil(t, next)
	require.Len(t, next.Bytes(), grown+mailboxSize)
	require.Equal(t, next.Addr()+grown+mailboxOut, rs.SGL[0].Addr, "from behind the new ring")
	require.Equal(t, uint32(flowctl.ResizeLen), rs.SGL[0].Length)
	addr, rkey, size := parseRingDesc(next.Bytes()[grown+mailboxOut:])
	require.Equal(t, next.Addr(), addr)
	require.Equal(t, next.RKey(), rkey)
	require.Equal(t, uint32(grown), size)

	old := c.ep.ring
	arriveImm(t, c, 3, flowctl.Imm{Kind: flowctl.KindSwitch}, 0)
	require.Same(t, next, c.ep.ring, "the new ring is current after the peer's switch")
	require.Same(t, old, c.ep.oldRing, "the old ring is kept while it holds bytes")
	copy(next.Bytes(), "new")
	arriveImm(t, c, 4, flowctl.Imm{Kind: flowctl.KindData}, 3)
	c.consume(0, 0, true) // the Read in progress ends

	got := make([]byte, 0, 3*len(chunk)+3)
	buf := make([]byte, 8<<10)
	for len(got) < cap(got) {
		n, err := c.Read(buf)
		require.NoError(t, err)
		got = append(got, buf[:n]...)
	}
	want := append(bytes.Repeat(chunk, 3), "new"...)
	require.True(t, bytes.Equal(want, got), "read %d bytes across the switch, want %d", len(got), len(want))
	require.Nil(t, c.ep.oldRing, "the old ring outlived its bytes")
	require.Equal(t, ringState{size: grown, switches: 1}, ringOf(c))
	require.NoError(t, connErr(c))
}

// TestPeerRingResizeOnFake: a resize from the peer is read out of the mailbox behind our
// ring; our switch follows it, and our data goes to the peer's new ring from then on. A
// resize whose description names another size than its immediate is a protocol error.
func TestPeerRingResizeOnFake(t *testing.T) {
	tests := []struct {
		name     string
		descSize uint32
		wantErr  error
	}{
		{"as announced", 64 << 10, nil},
		{"size differs", 32 << 10, ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, q := resizingConn(t)
			const newAddr, newKey = 0xabc0000, 9
			putRingDesc(c.ep.ring.Bytes()[c.fc.RingSize()+mailboxIn:], newAddr, newKey, tt.descSize)
			arriveImm(t, c, 0, flowctl.Imm{Kind: flowctl.KindResize, RingLog2: 16}, flowctl.ResizeLen)
			if tt.wantErr != nil {
				require.ErrorIs(t, connErr(c), tt.wantErr)
				require.ErrorContains(t, connErr(c), "resize to 65536 bytes describes a ring of 32768")
				return
			}
			require.NoError(t, connErr(c))
			require.Equal(t, []flowctl.Kind{flowctl.KindSwitch}, postedKinds(t, q), "our switch")
			_, err := c.Write([]byte("to the new ring"))
			require.NoError(t, err)
			wrs := q.posted()
			data := wrs[len(wrs)-1]
			require.Equal(t, uint64(newAddr), data.RemoteAddr, "data after the switch lands at the new ring's start")
			require.Equal(t, uint32(newKey), data.RKey)
		})
	}
}

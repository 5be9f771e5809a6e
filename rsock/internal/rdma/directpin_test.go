package rdma

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/shm"
	"github.com/rsockio/rsock/verbs/soft"
)

// pinningRegProvider is soft made to look like rdma-core for direct writes: it pins
// what it registers (PinsMemory) and its PDs register caller memory (RegMemory),
// counting the calls and, with enomem set, failing them as ibv does when the kernel
// will pin no more.
type pinningRegProvider struct {
	*soft.Fabric
	enomem bool
	calls  int // RegMemory calls; the Conn's mu serializes them in these tests
}

func (p *pinningRegProvider) PinsMemory() bool { return true }

func (p *pinningRegProvider) Open(name string) (verbs.Context, error) {
	c, err := p.Fabric.Open(name)
	if err != nil {
		return nil, err
	}
	return regContext{Context: c, p: p}, nil
}

type regContext struct {
	verbs.Context
	p *pinningRegProvider
}

func (c regContext) AllocPD() (verbs.PD, error) {
	pd, err := c.Context.AllocPD()
	if err != nil {
		return nil, err
	}
	return regPD{PD: pd, p: c.p}, nil
}

type regPD struct {
	verbs.PD
	p *pinningRegProvider
}

func (pd regPD) RegMemory(buf []byte, access verbs.AccessFlags) (verbs.MR, error) {
	pd.p.calls++
	if pd.p.enomem {
		return nil, fmt.Errorf("ibv: register %d bytes of memory: %w: %w", len(buf), verbs.ErrNoResources, syscall.ENOMEM)
	}
	return pd.PD.(verbs.MemoryRegistrar).RegMemory(buf, access)
}

// pageRound is n rounded up to whole pages, as a pinning provider's charge counts it.
func pageRound(n int) int64 {
	page := os.Getpagesize()
	return int64((n + page - 1) / page * page)
}

// TestWriteDirectPinned writes from one buffer, twice, on a provider that pins, under
// the limits that apply to what it pins, and checks which Writes went direct, what was
// counted while the buffer was cached and after Close, and that every Write delivered
// its bytes whatever path it took: a registration refused stages the Write, never
// fails it.
func TestWriteDirectPinned(t *testing.T) {
	const size = directPinMinWrite
	for _, tc := range []struct {
		name       string
		size       int
		limit      func(t *testing.T, a *Conn) // applied once the pair is up
		enomem     bool
		wantCalls  int  // RegMemory calls for the two Writes
		wantCached bool // the buffer is registered after the Writes
		wantOn     bool // direct writes still on after them
	}{
		{name: "no limit", size: size, wantCalls: 1, wantCached: true, wantOn: true},
		{name: "limit with room", size: size, limit: func(t *testing.T, a *Conn) {
			a.ep.opts.MaxRegisteredMemory = registeredOn(a.ep) + size
			_, pinned := RegisteredMemory()
			setMemlock(t, uint64(pinned+pageRound(size)), true)
		}, wantCalls: 1, wantCached: true, wantOn: true},
		{name: "over MaxRegisteredMemory", size: size, limit: func(t *testing.T, a *Conn) {
			a.ep.opts.MaxRegisteredMemory = registeredOn(a.ep) + size - 1
		}, wantCalls: 0, wantOn: false},
		{name: "over RLIMIT_MEMLOCK", size: size, limit: func(t *testing.T, a *Conn) {
			_, pinned := RegisteredMemory()
			setMemlock(t, uint64(pinned+pageRound(size))-1, true)
		}, wantCalls: 0, wantOn: false},
		{name: "RLIMIT_MEMLOCK does not bind", size: size, limit: func(t *testing.T, a *Conn) {
			setMemlock(t, 0, false)
		}, wantCalls: 1, wantCached: true, wantOn: true},
		{name: "kernel ENOMEM", size: size, enomem: true, wantCalls: 1, wantOn: false},
		{name: "over directPinMax", size: directPinMax + 1, wantCalls: 0, wantOn: true},
		{name: "under directPinMinWrite", size: directPinMinWrite - 1, wantCalls: 0, wantOn: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			closeIdleAll(t)
			f := soft.New(soft.Options{})
			p := &pinningRegProvider{Fabric: f, enomem: tc.enomem}
			a, b := connPair(t, p, Options{GrowRingTo: -1, NoPlacement: true}) // counts the Writes' registrations only
			if tc.limit != nil {
				tc.limit(t, a)
			}
			total0, pinned0 := RegisteredMemory()
			buf := streamBytes(7, tc.size)
			want := bytes.Clone(buf)
			got := make(chan []byte, 1)
			go func() {
				all, _ := io.ReadAll(b)
				got <- all
			}()
			for i := range 2 {
				n, err := a.Write(buf)
				require.NoError(t, err, "Write %d", i)
				require.Equal(t, len(buf), n, "Write %d", i)
				buf[0]++ // reused at once: the next Write carries the change
			}
			want = append(want, want...)
			want[len(buf)]++

			require.Equal(t, tc.wantCalls, p.calls, "RegMemory calls")
			a.mu.Lock()
			cached := a.direct.entries[0].mr != nil
			on := a.direct.reg != nil
			a.mu.Unlock()
			require.Equal(t, tc.wantCached, cached, "buffer cached")
			require.Equal(t, tc.wantOn, on, "direct writes on")
			total, pinned := RegisteredMemory()
			if cached {
				require.Equal(t, total0+int64(len(buf)), total, "registered bytes, buffer cached")
				require.Equal(t, pinned0+pageRound(len(buf)), pinned, "pinned bytes, buffer cached")
			} else {
				require.Equal(t, total0, total, "registered bytes, nothing cached")
				require.Equal(t, pinned0, pinned, "pinned bytes, nothing cached")
			}

			require.NoError(t, a.Close())
			all := <-got
			require.True(t, bytes.Equal(want, all), "the stream read differs from the one written (%d bytes of %d)", len(all), len(want))
			require.NoError(t, b.Close())
			requireReleased(t, f)
			closeIdleAll(t)
			total, pinned = RegisteredMemory()
			require.Equal(t, int64(0), total, "registered bytes after Close")
			require.Equal(t, int64(0), pinned, "pinned bytes after Close")
		})
	}
}

// TestWriteDirectMinOverSHM checks that on shm, which registers local memory only, a
// direct Write takes directMinWrite bytes at least, as on soft (not directPinMinWrite,
// which only providers that pin take): one byte less is staged, and both deliver their
// bytes.
func TestWriteDirectMinOverSHM(t *testing.T) {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	a, b := connPair(t, p, Options{})
	got := make(chan []byte, 1)
	go func() {
		all, _ := io.ReadAll(b)
		got <- all
	}()
	small, large := streamBytes(1, directMinWrite-1), streamBytes(2, directMinWrite)
	_, err = a.Write(small)
	require.NoError(t, err)
	require.Zero(t, directRegistered(a), "a Write under directMinWrite is staged")
	_, err = a.Write(large)
	require.NoError(t, err)
	require.Equal(t, 1, directRegistered(a), "a Write of directMinWrite is direct")
	require.NoError(t, a.Close())
	require.Equal(t, append(small, large...), <-got)
	require.NoError(t, b.Close())
}

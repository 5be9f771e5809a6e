package shm

import (
	"bytes"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// testRing returns the two ends of a ring of size bytes over private memory: a
// producer and a consumer sharing its cursors and sleeping word.
func testRing(size int) (prod, cons *ring) {
	var words [3]uint64
	data := make([]byte, size)
	sleep := new(uint32)
	p := &ring{data: data, prod: &words[0], cons: &words[1], sleep: sleep}
	c := &ring{data: data, prod: &words[0], cons: &words[1], sleep: sleep}
	return p, c
}

// TestRingPublished: published, which Polls read without the consumer's lock, says
// whether a record waits, through pushes and pops, and answers "look" for cursors the
// peer made impossible, whose pop then fails.
func TestRingPublished(t *testing.T) {
	p, c := testRing(64)
	buf := make([]byte, 64)
	require.False(t, c.published(), "empty")
	for round := range 3 {
		ok, _, err := p.push([]byte("record"), false)
		require.NoError(t, err)
		require.True(t, ok)
		require.True(t, c.published(), "round %d: a record waits", round)
		rec, err := c.pop(buf)
		require.NoError(t, err)
		require.Equal(t, "record", string(rec))
		require.False(t, c.published(), "round %d: consumed", round)
	}
	atomic.AddUint64(c.prod, 3) // a peer's impossible cursor
	require.True(t, c.published())
	_, err := c.pop(buf)
	require.ErrorIs(t, err, errChannel)
}

// TestRingRecords: records of every length go through, in order, across the end of
// the ring, and a full ring refuses a record whole.
func TestRingRecords(t *testing.T) {
	tests := []struct {
		size int
		lens []int
	}{
		{64, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 27, 28, 1, 1}},
		{64, []int{60, 60, 60, 60}}, // each fills the ring: 4+60 bytes
		{128, []int{13, 50, 33, 7, 60, 100, 3, 28, 28, 28, 1}},
	}
	for _, tt := range tests {
		p, c := testRing(tt.size)
		buf := make([]byte, tt.size)
		for i, n := range tt.lens {
			rec := bytes.Repeat([]byte{byte(i + 1)}, n)
			ok, _, err := p.push(rec, true)
			require.NoError(t, err)
			require.True(t, ok, "ring(%d).push(%d bytes) after %v", tt.size, n, tt.lens[:i])
			// A second record that does not fit is refused, and the ring is unchanged.
			if big := bytes.Repeat([]byte{0xee}, tt.size-n); len(big) > 0 {
				ok, _, err := p.push(big, true)
				require.NoError(t, err)
				require.False(t, ok, "ring(%d).push(%d bytes) with %d bytes in it", tt.size, len(big), n)
			}
			got, err := c.pop(buf)
			require.NoError(t, err)
			require.Equal(t, rec, got, "ring(%d).pop() after push(%d bytes)", tt.size, n)
			got, err = c.pop(buf)
			require.NoError(t, err)
			require.Nil(t, got, "ring(%d).pop() of an empty ring", tt.size)
		}
	}
}

// TestRingRejects: cursors and lengths a peer could write that cannot be are errors,
// never a panic or an out-of-bounds copy.
func TestRingRejects(t *testing.T) {
	tests := []struct {
		name  string
		spoil func(p, c *ring)
		pop   bool // the consumer sees it (else the producer)
	}{
		{"ProducerFarAhead", func(p, c *ring) { atomic.StoreUint64(p.prod, 1<<40) }, true},
		{"ProducerMisaligned", func(p, c *ring) { atomic.StoreUint64(p.prod, 12) }, true},
		{"ProducerBehind", func(p, c *ring) { c.pos = 64; atomic.StoreUint64(p.prod, 8) }, true},
		{"ZeroLength", func(p, c *ring) { atomic.StoreUint64(p.prod, 8) }, true},
		{"LongerThanPublished", func(p, c *ring) { le.PutUint32(p.data, 20); atomic.StoreUint64(p.prod, 16) }, true},
		{"LongerThanBuffer", func(p, c *ring) { le.PutUint32(p.data, 40); atomic.StoreUint64(p.prod, 48) }, true},
		{"HugeLength", func(p, c *ring) { le.PutUint32(p.data, ^uint32(0)); atomic.StoreUint64(p.prod, 64) }, true},
		{"ConsumerAhead", func(p, c *ring) { atomic.StoreUint64(c.cons, 8) }, false},
		{"ConsumerFarBehind", func(p, c *ring) { p.pos = 1 << 20 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, c := testRing(64)
			tt.spoil(p, c)
			if tt.pop {
				got, err := c.pop(make([]byte, 32))
				require.ErrorIs(t, err, errChannel, "pop() = %x", got)
				return
			}
			_, _, err := p.push([]byte{1}, true)
			require.ErrorIs(t, err, errChannel)
		})
	}
}

// TestRingWake: a producer reports a sleeping consumer once, and only for an urgent
// record; the word is cleared for the next sleep.
func TestRingWake(t *testing.T) {
	tests := []struct {
		asleep, urgent, wake bool
	}{
		{false, true, false},
		{true, true, true},
		{true, false, false},
	}
	for _, tt := range tests {
		p, _ := testRing(64)
		if tt.asleep {
			atomic.StoreUint32(p.sleep, 1)
		}
		_, wake, err := p.push([]byte{1}, tt.urgent)
		require.NoError(t, err)
		require.Equal(t, tt.wake, wake, "push(urgent %v) to a consumer asleep %v", tt.urgent, tt.asleep)
		_, again, _ := p.push([]byte{1}, tt.urgent)
		require.False(t, again, "second push(urgent %v) woke the consumer again", tt.urgent)
		if tt.wake {
			require.Zero(t, atomic.LoadUint32(p.sleep), "sleeping word after a wake")
		}
	}
}

// TestMapChannel: a responder maps only a sealed, writable memfd of a channel's size.
func TestMapChannel(t *testing.T) {
	tests := []struct {
		name string
		fd   func(t *testing.T) int
		ok   bool
	}{
		{"Channel", func(t *testing.T) int {
			fd, ch, err := newChannelMemory(nil)
			require.NoError(t, err)
			ch.unmap()
			return fd
		}, true},
		{"Unsealed", func(t *testing.T) int { return sealedMemfd(t, chanSize, false) }, false},
		{"Small", func(t *testing.T) int { return sealedMemfd(t, chanSize-1, true) }, false},
		{"ReadOnly", func(t *testing.T) int {
			fd := sealedMemfd(t, chanSize, true)
			defer unix.Close(fd)
			ro, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			require.NoError(t, err)
			return ro
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch, err := mapChannel(tt.fd(t), nil)
			if !tt.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Len(t, ch.mem, chanSize)
			require.Equal(t, uint32(1), atomic.LoadUint32(ch.word32(offRespSleep)), "a new channel's responder starts asleep")
			ch.unmap()
		})
	}
}

// FuzzRingPop: whatever a peer writes in a ring's bytes and its producer cursor, pop
// returns a record that was published whole within the ring, or an error; it never
// panics or reads outside the ring.
func FuzzRingPop(f *testing.F) {
	f.Add([]byte{5, 0, 0, 0, 'h', 'e', 'l', 'l', 'o', 0, 0, 0, 0, 0, 0, 0}, uint64(16), uint64(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, uint64(8), uint64(0))
	f.Add([]byte{3, 0, 0, 0, 1, 2, 3, 0}, uint64(1<<63), uint64(1<<63-8))
	f.Fuzz(func(t *testing.T, data []byte, prod, pos uint64) {
		const size = 64
		p, c := testRing(size)
		copy(p.data, data)
		atomic.StoreUint64(p.prod, prod)
		c.pos = pos &^ 7
		buf := make([]byte, 32)
		rec, err := c.pop(buf)
		if err != nil || rec == nil {
			return
		}
		if len(rec) == 0 || len(rec) > len(buf) || uint64(4+len(rec)) > prod-pos&^7 {
			t.Fatalf("pop() = %d bytes with %d published", len(rec), prod-pos&^7)
		}
		if c.pos != (pos&^7)+align8(4+uint64(len(rec))) || atomic.LoadUint64(c.cons) != c.pos {
			t.Fatalf("consumer cursor %d after a %d-byte record from %d", c.pos, len(rec), pos&^7)
		}
	})
}

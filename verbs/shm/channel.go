package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A channel is the shared memory one requester QP and its destination QP exchange
// requests and responses through: a memfd the requester creates when it connects and
// passes, sealed, with its hello. It holds two single-producer rings of records, the
// requests (requester → responder) and the responses (responder → requester), their
// cursors and a "sleeping" word for each consumer:
//
//	offset 0       request ring producer cursor   (requester writes)
//	offset 64      request ring consumer cursor   (responder writes)
//	offset 128     response ring producer cursor  (responder writes)
//	offset 192     response ring consumer cursor  (requester writes)
//	offset 256     responder sleeping             (responder sets, requester clears)
//	offset 320     requester sleeping             (requester sets, responder clears)
//	offset 4096    request ring, reqRingSize bytes
//	then           response ring, respRingSize bytes
//
// Cursors are byte counts that only grow, multiples of 8; a record is a u32 length
// (little endian) and that many bytes of a wire message (wire.go), padded to 8, and may
// wrap around the ring's end. Each side keeps its own cursors in private memory and only
// publishes them: what it reads of the other side's cursors, lengths and records is
// checked (a cursor that claims more than the ring holds, a record longer than the
// bytes published or than any message) and a violation ends the connection. Records are
// copied out of shared memory before they are decoded, so a peer that rewrites one
// under the reader changes only what the reader copied, never its bounds.
//
// Rings are consumed by polling (drive.go). A consumer that stops polling says it is
// sleeping, looks at the ring once more (a record published in between would otherwise
// wait for a doorbell nobody rings), and blocks on the connection's socket. A producer
// that publishes a record and finds the consumer sleeping clears the word and rings the
// doorbell: a one-byte datagram on the socket. Cursor and sleeping-word accesses are
// sync/atomic operations, sequentially consistent, so either the sleeper sees the
// record or the producer sees the sleeper.
const (
	chanHeader   = 4096
	reqRingSize  = 1 << 18
	respRingSize = 1 << 16
	chanSize     = chanHeader + reqRingSize + respRingSize

	offReqProd   = 0
	offReqCons   = 64
	offRespProd  = 128
	offRespCons  = 192
	offRespSleep = 256 // the responder sleeps
	offReqSleep  = 320 // the requester's reader sleeps

	// maxInflight bounds the requests a requester has in the channel without having
	// read their responses, so that the response ring never fills: 16 bytes a response.
	maxInflight = respRingSize / 16
)

var errChannel = errors.New("shm: channel broken by the peer")

// channel is one side's view of a mapped channel.
type channel struct {
	mem   []byte    // the whole mapping
	quota *mapQuota // what the mapping is counted against (mapquota.go)
}

// newChannelMemory creates a sealed memfd for a channel and maps it, counted against
// quota, the responder marked as sleeping so that the first request rings the doorbell.
func newChannelMemory(quota *mapQuota) (int, *channel, error) {
	fd, mem, err := newSharedMemory(chanSize, quota)
	if err != nil {
		return -1, nil, fmt.Errorf("shm: channel: %w", err)
	}
	ch := &channel{mem: mem[:chanSize:chanSize], quota: quota}
	atomic.StoreUint32(ch.word32(offRespSleep), 1)
	return fd, ch, nil
}

// mapChannel maps the channel memfd a requester passed, after the checks of
// mapPeerRegion (sealed, large enough), counted against quota; it consumes fd.
func mapChannel(fd int, quota *mapQuota) (*channel, error) {
	mem, writable, err := mapPeerRegion(fd, chanSize, quota)
	if err != nil {
		return nil, err
	}
	if !writable {
		unmap(mem, quota)
		return nil, fmt.Errorf("%w: read-only channel", errMalformed)
	}
	return &channel{mem: mem, quota: quota}, nil
}

func (ch *channel) word64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&ch.mem[off])) }
func (ch *channel) word32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&ch.mem[off])) }

// unmap releases the mapping; nothing may use the channel afterwards.
func (ch *channel) unmap() { unmap(ch.mem, ch.quota) }

// ring is one direction of a channel as its producer or its consumer sees it.
type ring struct {
	data  []byte
	prod  *uint64 // the shared producer cursor
	cons  *uint64 // the shared consumer cursor
	sleep *uint32 // the consumer's sleeping word
	pos   uint64  // this side's own cursor: the producer's or the consumer's
}

// requestRing and responseRing return the two rings of ch.
func (ch *channel) requestRing() ring {
	return ring{data: ch.mem[chanHeader : chanHeader+reqRingSize : chanHeader+reqRingSize],
		prod: ch.word64(offReqProd), cons: ch.word64(offReqCons), sleep: ch.word32(offRespSleep)}
}

func (ch *channel) responseRing() ring {
	d := ch.mem[chanHeader+reqRingSize : chanSize : chanSize]
	return ring{data: d, prod: ch.word64(offRespProd), cons: ch.word64(offRespCons), sleep: ch.word32(offReqSleep)}
}

func align8(n uint64) uint64 { return (n + 7) &^ 7 }

// push publishes rec as a record. It reports false, publishing nothing, if the ring
// lacks room, and, if urgent, whether the consumer was sleeping (the caller rings the
// doorbell); errChannel if the consumer's cursor is impossible.
func (r *ring) push(rec []byte, urgent bool) (ok, wake bool, err error) {
	size := uint64(len(r.data))
	used := r.pos - atomic.LoadUint64(r.cons)
	if used > size {
		return false, false, fmt.Errorf("%w: consumer cursor %d bytes behind", errChannel, used)
	}
	total := align8(4 + uint64(len(rec)))
	if size-used < total {
		return false, false, nil
	}
	at := r.pos % size
	le.PutUint32(r.data[at:], uint32(len(rec)))
	at = (at + 4) % size
	n := copy(r.data[at:], rec)
	copy(r.data, rec[n:])
	r.pos += total
	atomic.StoreUint64(r.prod, r.pos)
	return true, urgent && r.wakeConsumer(), nil
}

// wakeConsumer reports whether the consumer said it sleeps, clearing the word: the
// caller then rings the doorbell, once.
func (r *ring) wakeConsumer() bool {
	v := atomic.LoadUint32(r.sleep)
	return v != 0 && atomic.CompareAndSwapUint32(r.sleep, v, 0)
}

// pending reports whether a record (or an impossible cursor) waits to be popped.
func (r *ring) pending() bool { return atomic.LoadUint64(r.prod) != r.pos }

// published reports, without the consumer's lock, whether the producer published past
// what the consumer last consumed: both are shared words, so a Poll that finds nothing
// to do in a ring learns it without taking the lock that guards the consumer's cursor.
// The peer writes either word as it likes; a wrong answer only makes a Poll look in
// its own connection's ring when it need not, or leave that ring to its goroutine
// (serve, readLoop), and so costs no one but that peer. The caller keeps the mapping
// alive while it looks (CQ.peekMu).
func (r *ring) published() bool { return atomic.LoadUint64(r.prod) != atomic.LoadUint64(r.cons) }

// pop copies the next record into buf and returns it, or nil if the ring is empty; a
// record longer than buf, or cursors or lengths that cannot be, are errChannel.
func (r *ring) pop(buf []byte) ([]byte, error) {
	size := uint64(len(r.data))
	avail := atomic.LoadUint64(r.prod) - r.pos
	if avail == 0 {
		return nil, nil
	}
	if avail > size || avail%8 != 0 {
		return nil, fmt.Errorf("%w: producer cursor %d bytes ahead", errChannel, avail)
	}
	at := r.pos % size
	n := uint64(le.Uint32(r.data[at:]))
	total := align8(4 + n)
	if n == 0 || n > uint64(len(buf)) || total > avail {
		return nil, fmt.Errorf("%w: record of %d bytes", errChannel, n)
	}
	at = (at + 4) % size
	out := buf[:n]
	k := copy(out, r.data[at:])
	copy(out[k:], r.data)
	r.pos += total
	atomic.StoreUint64(r.cons, r.pos)
	return out, nil
}

// doorbell is the one-byte datagram that wakes a sleeping consumer.
var doorbell = []byte{msgDoorbell}

// ringDoorbell sends the doorbell on the socket whose descriptor is fd, without
// blocking: if the peer's socket is full, doorbells wait there already.
func ringDoorbell(fd int) { unix.Write(fd, doorbell) }

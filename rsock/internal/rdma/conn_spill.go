package rdma

import "sync"

// spillChunkSize is the unit in which a Conn's spill buffer grows and shrinks.
const spillChunkSize = 64 << 10

// spillChunks recycles spill chunks across connections, so that a connection that
// spills now and then allocates nothing in steady state, and one that stops spilling
// gives its memory back.
var spillChunks = sync.Pool{New: func() any { return new([spillChunkSize]byte) }}

// spillBuf is the unpinned part of a Conn's receive buffer: bytes moved out of the ring
// while the application was not reading, oldest first, in chunks taken from spillChunks
// as it grows and given back as it drains. It holds a contiguous stretch of the stream
// that ends where the ring's unread bytes begin.
//
// It is not safe for concurrent use. The Conn mutates it with its mutex held, and only
// while no Read is in progress; a Read copies out of it without the mutex, which is
// safe because nothing else touches it until the Read ends.
type spillBuf struct {
	chunks []*[spillChunkSize]byte // oldest first
	head   int                     // offset of the oldest byte in chunks[0]
	n      int                     // bytes held
}

// len returns how many bytes b holds.
func (b *spillBuf) len() int { return b.n }

// write appends p, growing b by as many chunks as it needs.
func (b *spillBuf) write(p []byte) {
	for len(p) > 0 {
		end := b.head + b.n
		i, off := end/spillChunkSize, end%spillChunkSize
		if i == len(b.chunks) {
			b.chunks = append(b.chunks, spillChunks.Get().(*[spillChunkSize]byte))
		}
		m := copy(b.chunks[i][off:], p)
		b.n += m
		p = p[m:]
	}
}

// copyOut copies the oldest bytes into p and returns how many; b is unchanged.
func (b *spillBuf) copyOut(p []byte) int {
	n, off := 0, b.head
	for _, ch := range b.chunks {
		if n == len(p) || n == b.n {
			break
		}
		m := copy(p[n:min(len(p), b.n)], ch[off:])
		n += m
		off = 0
	}
	return n
}

// peek returns the oldest bytes that lie contiguous in one chunk; b is unchanged.
func (b *spillBuf) peek() []byte {
	if b.n == 0 {
		return nil
	}
	return b.chunks[0][b.head:min(b.head+b.n, spillChunkSize)]
}

// discard drops the oldest n bytes (n ≤ len()) and gives back the chunks they emptied.
func (b *spillBuf) discard(n int) {
	b.head += n
	b.n -= n
	if b.n == 0 {
		b.release()
		return
	}
	for b.head >= spillChunkSize {
		spillChunks.Put(b.chunks[0])
		copy(b.chunks, b.chunks[1:])
		b.chunks[len(b.chunks)-1] = nil
		b.chunks = b.chunks[:len(b.chunks)-1]
		b.head -= spillChunkSize
	}
}

// release drops every byte and gives back every chunk.
func (b *spillBuf) release() {
	for i, ch := range b.chunks {
		spillChunks.Put(ch)
		b.chunks[i] = nil
	}
	b.chunks = b.chunks[:0]
	b.head, b.n = 0, 0
}

package rdma

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSpillBuf writes and drains a spill buffer in steps that cross chunk boundaries,
// checking every byte against a reference queue and that drained chunks go back.
func TestSpillBuf(t *testing.T) {
	type step struct {
		write   int // bytes appended
		discard int // then bytes dropped from the front, after checking copyOut and peek
		read    int // size of the copyOut buffer
	}
	tests := []struct {
		name   string
		steps  []step
		chunks int // chunks held at the end
	}{
		{"empty", []step{{0, 0, 10}}, 0},
		{"within a chunk", []step{{100, 40, 50}, {10, 70, 100}}, 0},
		{"exactly one chunk", []step{{spillChunkSize, 0, spillChunkSize}}, 1},
		{"across two chunks", []step{{spillChunkSize + 10, 5, spillChunkSize + 10}}, 2},
		{"drain the first chunk", []step{{spillChunkSize + 10, spillChunkSize, 7}}, 1},
		{"drain across a boundary", []step{{3 * spillChunkSize, spillChunkSize + 1, 2 * spillChunkSize}, {100, 100, 1}}, 3},
		{"fill, drain, refill", []step{{2*spillChunkSize + 5, 2*spillChunkSize + 5, 1}, {17, 3, 20}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b spillBuf
			var ref []byte
			next := byte(0)
			for i, st := range tt.steps {
				p := make([]byte, st.write)
				for k := range p {
					p[k] = next
					next = next*7 + 1
				}
				b.write(p)
				ref = append(ref, p...)
				require.Equal(t, len(ref), b.len(), "step %d: len()", i)

				out := make([]byte, st.read)
				n := b.copyOut(out)
				require.Equal(t, min(st.read, len(ref)), n, "step %d: copyOut(%d bytes) with %d held", i, st.read, len(ref))
				require.True(t, bytes.Equal(ref[:n], out[:n]), "step %d: copyOut returns other bytes", i)
				peek := b.peek()
				require.True(t, bytes.HasPrefix(ref, peek), "step %d: peek returns other bytes", i)
				if len(ref) > 0 {
					require.NotEmpty(t, peek, "step %d: peek with %d held", i, len(ref))
				}

				b.discard(st.discard)
				ref = ref[st.discard:]
				require.Equal(t, len(ref), b.len(), "step %d: len() after discard(%d)", i, st.discard)
			}
			require.Len(t, b.chunks, tt.chunks, "chunks held with %d bytes left at offset %d", b.len(), b.head)
			b.release()
			require.Zero(t, b.len())
			require.Empty(t, b.chunks)
		})
	}
}

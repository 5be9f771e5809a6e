package soft_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestTap checks that the tap sees each delivered message's bytes, for every operation,
// and nothing once removed or when the message fails.
func TestTap(t *testing.T) {
	tests := []struct {
		name  string
		wr    func(a, b *side) verbs.SendWR
		recv  bool // the responder needs a receive WQE
		fails bool // the message is not delivered: the tap must not see it
	}{
		{"write", func(a, b *side) verbs.SendWR {
			return verbs.SendWR{ID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{sge(a.mr, 0, 11)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
		}, false, false},
		{"write with imm", func(a, b *side) verbs.SendWR { return writeImm(7, a.mr, b.mr, 0, 11) }, true, false},
		{"send", func(a, b *side) verbs.SendWR {
			return verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{sge(a.mr, 0, 11)}}
		}, true, false},
		{"inline send", func(a, b *side) verbs.SendWR {
			return verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled | verbs.SendInline, SGL: []verbs.SGE{sge(a.mr, 0, 11)}}
		}, true, false},
		{"read", func(a, b *side) verbs.SendWR {
			return verbs.SendWR{ID: 1, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{sge(a.mr, 0, 11)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
		}, false, false},
		{"write with a bad rkey", func(a, b *side) verbs.SendWR {
			return verbs.SendWR{ID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{sge(a.mr, 0, 11)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey() + 1}
		}, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := soft.New(soft.Options{Devices: 2})
			a, b := connectPair(t, f, pairOpts{})
			msg := []byte("hello, wire")
			copy(a.mr.Bytes(), msg)
			copy(b.mr.Bytes(), msg) // what a READ fetches
			var mu sync.Mutex
			var seen []soft.TapEvent
			f.SetTap(func(ev soft.TapEvent) {
				mu.Lock()
				seen = append(seen, ev)
				mu.Unlock()
			})
			if tc.recv {
				require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{sge(b.mr, 1024, 64)}}}))
			}
			wr := tc.wr(a, b)
			require.NoError(t, a.qp.PostSend([]verbs.SendWR{wr}))
			wc := poll(t, a.scq, 1)
			mu.Lock()
			defer mu.Unlock()
			if tc.fails {
				require.NotEqual(t, verbs.WCSuccess, wc[0].Status)
				require.Empty(t, seen)
				return
			}
			require.Equal(t, verbs.WCSuccess, wc[0].Status)
			require.Len(t, seen, 1)
			ev := seen[0]
			require.Equal(t, msg, ev.Payload)
			require.Equal(t, wr.Opcode, ev.Op)
			require.Equal(t, "soft0", ev.From)
			require.Equal(t, "soft1", ev.To)
			require.Equal(t, a.qp.QPN(), ev.SrcQPN)
			require.Equal(t, b.qp.QPN(), ev.DestQPN)
			require.Equal(t, wr.Imm, ev.Imm)

			f.SetTap(nil)
			require.NoError(t, a.qp.PostSend([]verbs.SendWR{tc.wr(a, b)}))
			if tc.recv {
				require.NoError(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{sge(b.mr, 1024, 64)}}}))
			}
			poll(t, a.scq, 1)
			require.Len(t, seen, 1, "a removed tap saw a message")
		})
	}
}

package rc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// TestRecvQueue posts and completes receive WQEs in the steps of each case and checks
// the queue's order, SGL copies and slot accounting after every step.
func TestRecvQueue(t *testing.T) {
	type step struct {
		post     []uint64 // WR IDs posted, each with one SGE whose LKey is its ID
		pop      int      // then this many completed from the head
		released uint64   // slots released by polled completions, for InUse
		reset    bool     // then the queue is reset
		wantIDs  []uint64 // the WQEs left, oldest first
		wantUse  uint64
	}
	tests := []struct {
		name  string
		maxWR int
		steps []step
	}{
		{"post and complete in order", 3, []step{
			{post: []uint64{1, 2, 3}, wantIDs: []uint64{1, 2, 3}, wantUse: 3},
			{pop: 2, wantIDs: []uint64{3}, wantUse: 3},                                  // completed but not polled
			{released: 2, wantIDs: []uint64{3}, wantUse: 1},                             // polled
			{post: []uint64{4, 5}, released: 2, wantIDs: []uint64{3, 4, 5}, wantUse: 3}, // wraps
			{pop: 3, released: 5, wantUse: 0},
		}},
		{"reset frees every slot", 2, []step{
			{post: []uint64{1, 2}, pop: 1, released: 0, wantIDs: []uint64{2}, wantUse: 2},
			{reset: true, released: 0, wantUse: 0},
			{post: []uint64{3, 4}, released: 0, wantIDs: []uint64{3, 4}, wantUse: 2},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q RecvQueue
			q.Init(tt.maxWR, 2, nil)
			for i, s := range tt.steps {
				for _, id := range s.post {
					sgl := []verbs.SGE{{LKey: uint32(id)}}
					q.Post(&verbs.RecvWR{ID: id, SGL: sgl})
					sgl[0].LKey = 0 // the queue keeps its own copy
				}
				for range s.pop {
					q.Pop()
				}
				if s.reset {
					q.Reset(s.released)
				}
				var ids []uint64
				for k := range q.Len() {
					e := q.ring[(q.head+k)%len(q.ring)]
					require.Len(t, e.SGL, 1, "step %d: SGL of WQE %d", i, e.ID)
					require.Equal(t, uint32(e.ID), e.SGL[0].LKey, "step %d: SGL of WQE %d", i, e.ID)
					ids = append(ids, e.ID)
				}
				require.Equal(t, s.wantIDs, ids, "step %d: WQEs left", i)
				if q.Len() > 0 {
					require.Equal(t, s.wantIDs[0], q.Head().ID, "step %d: Head", i)
				}
				require.Equal(t, s.wantUse, q.InUse(s.released), "step %d: InUse(%d)", i, s.released)
			}
		})
	}
}

func TestRecvQueueAllocs(t *testing.T) {
	var q RecvQueue
	q.Init(4, 2, make([]verbs.SGE, 8))
	wr := verbs.RecvWR{ID: 1, SGL: []verbs.SGE{{Length: 1}, {Length: 2}}}
	allocs := testing.AllocsPerRun(100, func() {
		q.Post(&wr)
		_ = q.Head()
		q.Pop()
	})
	require.Zero(t, allocs, "allocations per post and completion")
}

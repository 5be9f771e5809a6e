package soft

import (
	"fmt"

	"github.com/rsockio/rsock/verbs"
)

// Query reports the QP's state and the connection its RTR transition set up, with the
// address vector as given (traffic class and service level included), as ibv_query_qp
// does on a device that applies them. It implements [verbs.QPQuerier].
func (q *QP) Query() (verbs.QPAttr, error) {
	if q.closed.Load() {
		return verbs.QPAttr{}, fmt.Errorf("soft: QP %#x: query: %w", q.qpn, verbs.ErrClosed)
	}
	q.sq.mu.Lock()
	defer q.sq.mu.Unlock()
	a := verbs.QPAttr{State: q.State(), DestQPN: q.sq.destQPN, Dest: q.sq.av}
	if q.sq.mtu != 0 {
		for m := verbs.MTU256; m <= verbs.MTU4096; m++ {
			if uint32(m.Bytes()) == q.sq.mtu {
				a.PathMTU = m
			}
		}
	}
	return a, nil
}

var _ verbs.QPQuerier = (*QP)(nil)

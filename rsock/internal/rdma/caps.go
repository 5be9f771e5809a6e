package rdma

import (
	"errors"
	"fmt"
	"strings"

	"github.com/rsockio/rsock/verbs"
)

// ErrDeviceLimit reports a connection whose resources the device cannot provide: a
// queue deeper than its max_qp_wr, more completions than one CQ holds (max_cqe), a
// ring larger than it can register (max_mr_size). The error names each figure.
var ErrDeviceLimit = errors.New("rdma: beyond the device's limits")

// checkCaps checks a connection's options against the limits of the device chosen for
// it, before the connection allocates anything on it, so that a device too small for them is a reason to
// stay on the fallback transport (named, with the figures) and not a verbs error in the
// middle of the setup. A limit of zero is one the provider does not report: unchecked.
//
// What is refused and what is fitted to the device:
//   - SendWQEs and RecvWQEs above MaxQPWR: refused. The receive depth is the peer's
//     WQE credit and the send depth sizes the staging pipeline; a silently shallower
//     queue would change both.
//   - GrowRecvWQEsTo above MaxQPWR: fitted (recvCap). Growth is an optimization the
//     user did not ask for by number, and the peer learns the bound from our offer.
//   - SendWQEs+RecvWQEs above MaxCQE: refused (one CQ must hold a connection's
//     completions). CQSize above MaxCQE is fitted: the shared CQ is created with
//     MaxCQE entries (device.pollerFor).
//   - RingSize or the first staging buffer above MaxMRSize: refused. Rings and staging
//     that grow (GrowRingTo) stop growing where the device refuses a registration,
//     as under a memory budget, so SendBufferSize bounds them only.
//   - Inline data: fitted, at min(MaxInline, 256) bytes (PrepareContext); larger
//     writes are posted from the registered staging buffer.
//   - Scatter/gather entries: every work request uses one SGE, which every device has.
func checkCaps(d verbs.DeviceAttr, opts Options) error {
	var over []string
	add := func(format string, args ...any) { over = append(over, fmt.Sprintf(format, args...)) }
	if d.MaxQPWR > 0 {
		if opts.SendWQEs > d.MaxQPWR {
			add("send queue depth %d > max_qp_wr %d", opts.SendWQEs, d.MaxQPWR)
		}
		if opts.RecvWQEs+1 > d.MaxQPWR { // and the proof WQE (conn_proof.go)
			add("receive queue depth %d > max_qp_wr %d", opts.RecvWQEs+1, d.MaxQPWR)
		}
	}
	if n := opts.SendWQEs + opts.RecvWQEs + 1; d.MaxCQE > 0 && n > d.MaxCQE {
		add("%d completions per connection > max_cqe %d", n, d.MaxCQE)
	}
	if d.MaxMRSize > 0 {
		if uint64(opts.RingSize) > d.MaxMRSize {
			add("receive ring of %d bytes > max_mr_size %d", opts.RingSize, d.MaxMRSize)
		}
		if first := opts.firstSendBuffer(); uint64(first) > d.MaxMRSize {
			add("send buffer of %d bytes > max_mr_size %d", first, d.MaxMRSize)
		}
	}
	if len(over) > 0 {
		return fmt.Errorf("%w of %s: %s", ErrDeviceLimit, d.Name, strings.Join(over, ", "))
	}
	return nil
}

// recvCap is how many receive WQEs, besides the proof WQE, a connection's QP is
// created with room for: GrowRecvWQEsTo, fitted below the device's max_qp_wr, and never
// below RecvWQEs (which checkCaps checked).
func recvCap(d verbs.DeviceAttr, opts Options) int {
	n := max(opts.GrowRecvWQEsTo, opts.RecvWQEs)
	if d.MaxQPWR > 0 {
		n = min(n, d.MaxQPWR-1)
	}
	return max(n, opts.RecvWQEs)
}

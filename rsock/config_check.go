package rsock

import (
	"cmp"
	"fmt"
	"math/bits"
	"time"

	"github.com/rsockio/rsock/flowctl"
	"github.com/rsockio/rsock/rsock/internal/rdma"
)

// Limits of the Config fields that size a connection's RDMA resources. A value the
// engine would refuse is refused by Listen and Dial, naming the field and its range,
// rather than accepted and then failing every upgrade in silence.
const (
	minSendBuffer = 1 << 10
	maxSendBuffer = 1 << 30
)

// check reports the first field of the resolved Config r that is out of its range, as
// an error matching [ErrInvalidConfig] whose text names the field, its value and what
// is allowed. Fields whose every value means something (booleans, pointers, durations
// where negative disables) are not checked.
func (r *Config) check() error {
	bad := func(field string, value any, want string) error {
		return fmt.Errorf("%w: %s is %v, want %s", ErrInvalidConfig, field, value, want)
	}
	pow2 := func(v int) bool { return v > 0 && bits.OnesCount(uint(v)) == 1 }
	ring := cmp.Or(r.RingSize, rdma.DefaultRingSize)
	switch {
	case r.Fallback != FallbackTCP && r.Fallback != FallbackQUIC:
		return bad("Fallback", r.Fallback, "FallbackTCP or FallbackQUIC")
	case r.Fallback == FallbackQUIC && r.TLSConfig == nil:
		return bad("TLSConfig", "nil", "a *tls.Config with FallbackQUIC (the QUIC fallback needs Config.TLSConfig)")
	case r.HandshakeTimeout < 0:
		return bad("HandshakeTimeout", r.HandshakeTimeout, nonNegative(DefaultHandshakeTimeout))
	case r.PlainSniffTimeout < 0:
		return bad("PlainSniffTimeout", r.PlainSniffTimeout, nonNegative(DefaultPlainSniffTimeout))
	case r.MaxConcurrentHandshakes < 0:
		return bad("MaxConcurrentHandshakes", r.MaxConcurrentHandshakes, nonNegative(DefaultMaxConcurrentHandshakes))
	case r.RingSize != 0 && (!pow2(r.RingSize) || r.RingSize < flowctl.MinRingSize || r.RingSize > flowctl.MaxRingSize):
		return bad("RingSize", r.RingSize, fmt.Sprintf("a power of two from %d (4 KiB) to %d (1 GiB), or 0 for the default, %d",
			flowctl.MinRingSize, flowctl.MaxRingSize, rdma.DefaultRingSize))
	case r.GrowRingTo > 0 && (!pow2(r.GrowRingTo) || r.GrowRingTo < ring || r.GrowRingTo > flowctl.MaxRingSize):
		return bad("GrowRingTo", r.GrowRingTo, fmt.Sprintf("a power of two from RingSize (%d) to %d (1 GiB), 0 for the default, %d, or negative for a fixed ring",
			ring, flowctl.MaxRingSize, rdma.DefaultGrowRingTo))
	case r.SendBufferSize != 0 && (r.SendBufferSize < minSendBuffer || r.SendBufferSize > maxSendBuffer):
		return bad("SendBufferSize", r.SendBufferSize, fmt.Sprintf("%d (1 KiB) to %d (1 GiB), or 0 for the default (half of GrowRingTo up to 256 KiB, or %d for a fixed ring)",
			minSendBuffer, maxSendBuffer, rdma.DefaultSendBufferSize))
	case r.RecvWQEs != 0 && (r.RecvWQEs < rdma.MinRecvWQEs || r.RecvWQEs > flowctl.MaxRecvWQEs):
		return bad("RecvWQEs", r.RecvWQEs, fmt.Sprintf("%d to %d, or 0 for the default, %d growing to %d",
			rdma.MinRecvWQEs, flowctl.MaxRecvWQEs, rdma.DefaultRecvWQEs, rdma.DefaultGrowRecvWQEsTo))
	case r.ReadBufferSize > rdma.MaxReadBufferSize:
		return bad("ReadBufferSize", r.ReadBufferSize, fmt.Sprintf("at most %d (1 GiB), 0 for the default, %d, or negative for none",
			rdma.MaxReadBufferSize, DefaultReadBufferSize))
	case r.MaxRegisteredMemory < 0:
		return bad("MaxRegisteredMemory", r.MaxRegisteredMemory, "a positive cap in bytes, or 0 for none")
	case r.TrafficClass < 0 || r.TrafficClass > 255:
		return bad("TrafficClass", r.TrafficClass, "0 to 255 (DSCP<<2 | ECN)")
	case r.ServiceLevel < 0 || r.ServiceLevel > 15:
		return bad("ServiceLevel", r.ServiceLevel, "0 to 15")
	case r.RoCEVersion < 0 || r.RoCEVersion > 2:
		return bad("RoCEVersion", r.RoCEVersion, "1 or 2, or 0 for no preference")
	}
	return nil
}

// nonNegative says what a field whose zero means def allows.
func nonNegative[T int | time.Duration](def T) string {
	return fmt.Sprintf("0 or more (0: the default, %v)", def)
}

package rc

import "time"

// rnrTimerMicros is the RNR NAK timer encoding of the InfiniBand specification, as listed
// for min_rnr_timer in ibv_modify_qp(3): index is the encoded value, entry the delay in µs.
// Zero encodes the longest delay, 655.36 ms.
var rnrTimerMicros = [32]int64{
	655360, 10, 20, 30, 40, 60, 80, 120,
	160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720,
	40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}

// RNRDelay returns how long a requester waits after an RNR NAK from a responder whose
// min_rnr_timer is enc (its low 5 bits).
func RNRDelay(enc uint8) time.Duration {
	return time.Duration(rnrTimerMicros[enc&31]) * time.Microsecond
}

// ACKTimeout returns the local ACK timeout that the RTS attribute timeout enc encodes,
// 4.096 µs × 2^enc, or 0 for enc 0, which means the requester waits for an
// acknowledgement forever.
func ACKTimeout(enc uint8) time.Duration {
	if enc == 0 {
		return 0
	}
	return time.Duration(4096<<(enc&31)) * time.Nanosecond
}

package soft

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

// minTimer is the shortest delay a scaled timer is given. Shorter delays would make an RNR
// loop that retries forever spin timers as fast as the runtime can fire them.
const minTimer = time.Microsecond

// rnrDelay returns how long a requester waits after an RNR NAK from a responder whose
// min_rnr_timer is enc, multiplied by scale.
func rnrDelay(enc uint8, scale float64) time.Duration {
	return scaled(time.Duration(rnrTimerMicros[enc&31])*time.Microsecond, scale)
}

// ackTimeout returns the local ACK timeout 4.096 µs × 2^enc multiplied by scale, or 0 for
// enc 0, which means the requester waits for an acknowledgement forever.
func ackTimeout(enc uint8, scale float64) time.Duration {
	if enc == 0 {
		return 0
	}
	return scaled(time.Duration(4096<<(enc&31))*time.Nanosecond, scale)
}

func scaled(d time.Duration, scale float64) time.Duration {
	d = time.Duration(float64(d) * scale)
	if d < minTimer {
		d = minTimer
	}
	return d
}

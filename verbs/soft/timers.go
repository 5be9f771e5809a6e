package soft

import (
	"time"

	"github.com/rsockio/rsock/verbs/internal/rc"
)

// minTimer is the shortest delay a scaled timer is given. Shorter delays would make an RNR
// loop that retries forever spin timers as fast as the runtime can fire them.
const minTimer = time.Microsecond

// rnrDelay returns how long a requester waits after an RNR NAK from a responder whose
// min_rnr_timer is enc, multiplied by scale.
func rnrDelay(enc uint8, scale float64) time.Duration {
	return scaled(rc.RNRDelay(enc), scale)
}

// ackTimeout returns the local ACK timeout 4.096 µs × 2^enc multiplied by scale, or 0 for
// enc 0, which means the requester waits for an acknowledgement forever.
func ackTimeout(enc uint8, scale float64) time.Duration {
	if enc == 0 {
		return 0
	}
	return scaled(rc.ACKTimeout(enc), scale)
}

func scaled(d time.Duration, scale float64) time.Duration {
	d = time.Duration(float64(d) * scale)
	if d < minTimer {
		d = minTimer
	}
	return d
}

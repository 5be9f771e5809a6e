package rdma

import (
	"fmt"
	"time"
)

// Liveness. A connection learns that its peer is gone in one of four ways, the first
// three at once and the last within a bound counted from the start of the connection:
//
//   - a failed completion: the QP's retry budget ran out (the path or the peer's
//     machine died while something was in flight), or the QP was flushed;
//   - the control channel (the bootstrap connection) ends: the peer's process died;
//   - an asynchronous event of the device: its port went down, or it failed (events.go);
//   - silence. Every keepalive period from Start, sendKeepalive posts a signaled probe
//     on the QP, which the peer's device acknowledges whatever its application does.
//     On a dead path the probe fails with the retry budget, within one period and
//     that budget of the path's death: ErrQPFailed. Should even that not happen (a
//     device that stops completing anything, a provider whose retries take longer),
//     maxSilentPeriods periods in a row without a single completion, of a probe or
//     of anything else, end the Conn with ErrKeepaliveTimeout. So a connection whose
//     peer falls silent at any moment, the very start included, fails within
//     (maxSilentPeriods+1) keepalive periods of the peer's last sign of life; the
//     proof exchange just before Start is one, so the bound holds from the start of
//     the connection too. (When the peer
//     notices first, it closes the control channel, and this side fails closeGrace
//     later with ErrControlLost.)
//
// A peer process that hangs while its machine answers is caught by the control
// channel instead: once the peer has sent one keepalive byte, three silent periods on
// the control channel end the Conn with ErrKeepaliveTimeout (readControl). A peer
// configured without keepalives sends none and is never cut off for being idle.

// maxSilentPeriods is how many keepalive periods in a row may pass without a single
// completion on the connection's QP before the Conn fails.
const maxSilentPeriods = 3

// heardLocked records a sign of life of the peer's device: a completion, send or
// receive. Called with mu held, on the poller's goroutine.
func (c *Conn) heardLocked() { c.heard++ }

// checkSilenceLocked runs once per keepalive period. It fails the Conn, and reports
// true, when nothing was heard from the peer's device for maxSilentPeriods periods.
// Called with mu held.
func (c *Conn) checkSilenceLocked() bool {
	if c.heard != c.heardMark {
		c.heardMark, c.silentPeriods = c.heard, 0
		return false
	}
	c.silentPeriods++
	if c.silentPeriods < maxSilentPeriods {
		return false
	}
	c.failLocked(fmt.Errorf("%w: no completion from the peer's device for %v",
		ErrKeepaliveTimeout, time.Duration(c.silentPeriods)*c.kaPeriod))
	return true
}

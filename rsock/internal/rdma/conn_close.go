package rdma

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// The control channel carries, after the upgrade, only keepalive bytes; its real message
// is its end. A peer that closes its Conn sends its FIN on the QP and waits for it to
// complete before closing the control channel, so the FIN is in our CQ when we see the
// close. A control channel that ends without a FIN having arrived within closeGrace
// means the peer process died, and fails the Conn.
var ctrlKeepalive = [1]byte{'K'}

const (
	// closeGrace is how long after the control channel closes the peer's FIN may still
	// be on its way through our poller.
	closeGrace = 500 * time.Millisecond
	// drainTimeout bounds how long Close waits for posted writes and its FIN to
	// complete. Only a peer that stopped responding makes it wait that long.
	drainTimeout = 5 * time.Second
)

// CloseWrite sends a FIN after all data written so far: the peer reads io.EOF after the
// bytes. Later Writes fail. Reads are unaffected.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return net.ErrClosed
	}
	if !c.writeClosed {
		c.writeClosed = true
		c.fc.CloseWrite()
		c.postControlLocked()
	}
	return nil
}

// Close unblocks pending Reads and Writes, sends a FIN if none was sent, waits for every
// posted write to complete (so each byte Write reported is in the peer's ring), then
// tears down the control channel, the QP and the registered memory.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.close() })
	return c.closeErr
}

func (c *Conn) close() error {
	c.mu.Lock()
	c.closing = true
	if !c.writeClosed {
		c.writeClosed = true
		c.fc.CloseWrite()
		c.postControlLocked()
	}
	ka := c.keepalive
	c.mu.Unlock()
	close(c.closed)
	if ka != nil {
		ka.Stop()
	}
	c.drain()

	err := ignoreClosed(c.ctrl.Close())
	c.startOnce.Do(func() { close(c.ctrlDone) }) // never started: no reader to wait for
	<-c.ctrlDone
	c.mu.Lock()
	if c.graceTimer != nil {
		c.graceTimer.Stop()
	}
	c.mu.Unlock()
	return errors.Join(err, c.teardown())
}

// Abandon tears the Conn down without a FIN and without touching the control channel,
// which stays the caller's: for a handshake that connected the QP but then fell back.
// The Conn must not have been started.
func (c *Conn) Abandon() error {
	var err error
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		close(c.closed)
		err = c.teardown()
	})
	return err
}

// teardown flushes the QP, stops its completions and releases every resource.
func (c *Conn) teardown() error {
	var errs []error
	if err := c.qp.ToError(); err != nil {
		errs = append(errs, fmt.Errorf("rdma: close: QP to ERROR: %w", err))
	}
	c.ep.poller.detach(c.qp.QPN())
	if err := c.ep.release(); err != nil {
		errs = append(errs, fmt.Errorf("rdma: close: %w", err))
	}
	return errors.Join(errs...)
}

// drain waits until the FIN has been posted and has completed (and with it, in order,
// every write before it), the Conn fails, the peer is gone, or drainTimeout passes.
func (c *Conn) drain() {
	var timeout <-chan time.Time
	for {
		c.mu.Lock()
		done := c.err != nil || c.peerGone || (c.finPosted && c.sqDone > c.finID)
		c.mu.Unlock()
		if done {
			return
		}
		if timeout == nil {
			t := time.NewTimer(drainTimeout)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-c.drained:
		case <-timeout:
			return
		}
	}
}

// readControl watches the control channel until it ends. Bytes on it are keepalives;
// with keepalives on, and once the peer has sent one, three silent periods are a
// timeout.
func (c *Conn) readControl() {
	defer close(c.ctrlDone)
	var buf [16]byte
	peerKeepsAlive := false
	for {
		c.mu.Lock()
		failed, closing := c.err != nil, c.closing
		c.mu.Unlock()
		if failed {
			if !closing {
				c.ctrl.Close() // tell the peer: its control reader sees the close
			}
			return
		}
		// Silence is a timeout only once the peer has shown it sends keepalives: a peer
		// configured without them must not be cut off for being idle.
		if c.kaPeriod > 0 && peerKeepsAlive {
			c.ctrl.SetReadDeadline(time.Now().Add(3 * c.kaPeriod))
		}
		n, err := c.ctrl.Read(buf[:])
		peerKeepsAlive = peerKeepsAlive || n > 0
		for _, b := range buf[:n] {
			if b != ctrlKeepalive[0] {
				c.mu.Lock()
				c.failLocked(fmt.Errorf("%w: byte %#x on the control channel", ErrProtocol, b))
				c.mu.Unlock()
				break
			}
		}
		if err != nil {
			c.mu.Lock()
			failed := c.err != nil
			c.mu.Unlock()
			if failed {
				continue // woken by failLocked: close the channel above
			}
			c.controlLost(err)
			return
		}
	}
}

// controlLost handles the end of the control channel: writes fail from now on, and
// reads end with io.EOF if the peer's FIN arrives within closeGrace, else with the
// loss.
func (c *Conn) controlLost(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peerGone = true
	signal(c.drained) // a Close draining toward a peer that is gone need not wait
	if c.closing {
		return
	}
	signal(c.writable)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.failLocked(fmt.Errorf("%w: nothing from the peer for %v", ErrKeepaliveTimeout, 3*c.kaPeriod))
		return
	}
	if c.fc.PeerClosed() {
		return
	}
	lost := fmt.Errorf("%w: %w", ErrControlLost, err)
	c.graceTimer = time.AfterFunc(closeGrace, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.fc.PeerClosed() {
			c.failLocked(lost)
		}
	})
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

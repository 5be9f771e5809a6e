package rdma

import (
	"io"
	"net"
	"os"
)

// Read copies bytes out of the receive ring. It returns buffered bytes even after the
// connection failed, so nothing that arrived is lost; then io.EOF after the peer's FIN,
// or the failure.
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(p) == 0 {
		return 0, c.readErr()
	}
	for {
		if isClosed(c.rdl.wait()) {
			return 0, os.ErrDeadlineExceeded
		}
		first, second, err := c.unread()
		if err != nil {
			return 0, err
		}
		if first.Len > 0 {
			// The bytes stay put until Consume: copy without holding mu.
			n := copy(p, c.ring[first.Off:first.Off+first.Len])
			if n < len(p) && second.Len > 0 {
				n += copy(p[n:], c.ring[:second.Len])
			}
			c.consume(n)
			return n, nil
		}
		if err := c.waitReadable(); err != nil {
			return 0, err
		}
	}
}

// WriteTo writes the ring's bytes straight to w, without an intermediate buffer, until
// the peer's FIN (returning nil) or an error.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	var total int64
	for {
		if isClosed(c.rdl.wait()) {
			return total, os.ErrDeadlineExceeded
		}
		first, second, err := c.unread()
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		if first.Len == 0 {
			if err := c.waitReadable(); err != nil {
				return total, err
			}
			continue
		}
		n, werr := w.Write(c.ring[first.Off : first.Off+first.Len])
		if werr == nil && second.Len > 0 {
			var m int
			m, werr = w.Write(c.ring[:second.Len])
			n += m
		}
		c.consume(n)
		total += int64(n)
		if werr != nil {
			return total, werr
		}
	}
}

type piece struct{ Off, Len int }

// unread returns the unread bytes as ring pieces, or, when there are none, the
// reason no more will come (io.EOF, a failure, net.ErrClosed), or nothing to wait.
func (c *Conn) unread() (first, second piece, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return first, second, net.ErrClosed
	}
	f, s := c.fc.Unread()
	if f.Len > 0 {
		return piece(f), piece(s), nil
	}
	return first, second, c.readErrLocked()
}

func (c *Conn) readErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return net.ErrClosed
	}
	return c.readErrLocked()
}

// readErrLocked is why a Read with nothing buffered returns now, or nil to wait.
func (c *Conn) readErrLocked() error {
	switch {
	case c.fc.PeerClosed():
		return io.EOF
	case c.err != nil:
		return c.err
	}
	return nil
}

// consume releases n bytes the application has taken and sends any credit update now
// due.
func (c *Conn) consume(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.fc.Consume(n); err != nil {
		c.failLocked(err) // cannot happen: n ≤ what Unread returned
		return
	}
	c.postControlLocked()
}

// waitReadable waits until something arrives, the read deadline passes, or the Conn
// closes.
func (c *Conn) waitReadable() error {
	dl := c.rdl.wait()
	select {
	case <-dl:
		return os.ErrDeadlineExceeded
	default:
	}
	select {
	case <-c.readable:
		return nil
	case <-dl:
		return os.ErrDeadlineExceeded
	case <-c.closed:
		return net.ErrClosed
	}
}

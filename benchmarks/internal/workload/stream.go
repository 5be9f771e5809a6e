package workload

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// finishTimeout bounds how long a workload waits for the server's last answer.
const finishTimeout = 30 * time.Second

// warmupOps is how many operations of size bytes a workload runs on its connection
// before it is measured: enough for rsock's ring and staging buffer to grow to their
// working size (their registrations allocate, once) and for the first Read to take the
// server's hello answer; a megabyte's worth, at least 16 and at most 256.
func warmupOps(size int) int {
	return max(16, min(256, (1<<20)/max(size, 1)))
}

// runStream writes p.Size-byte buffers on one connection, which the server drains.
func runStream(ctl Control, env *Env, p Params) (Metrics, error) {
	if env.Transport.Raw {
		return softStream(ctl, env, p.Size, env.Transport.Name == SoftVerbs3Copy)
	}
	c, err := openDrain(env, p.Size)
	if err != nil {
		return Metrics{}, err
	}
	defer c.Close()
	buf := make([]byte, p.Size)
	var sent uint64
	for range warmupOps(p.Size) {
		n, err := c.Write(buf)
		sent += uint64(n)
		if err != nil {
			return Metrics{}, err
		}
	}
	for ctl.Next() {
		n, err := c.Write(buf)
		sent += uint64(n)
		if err != nil {
			return Metrics{}, err
		}
	}
	if err := finishDrain(c, sent); err != nil {
		return Metrics{}, err
	}
	return Metrics{BytesPerOp: int64(p.Size)}, nil
}

// openDrain opens a connection the server drains into a size-byte buffer, and waits
// until the server is ready.
func openDrain(env *Env, size int) (net.Conn, error) {
	c, err := env.open(context.Background(), roleDrain, size)
	if err != nil {
		return nil, err
	}
	var ready [1]byte
	c.SetReadDeadline(time.Now().Add(finishTimeout))
	if _, err := io.ReadFull(c, ready[:]); err != nil || ready[0] != readyByte {
		c.Close()
		return nil, fmt.Errorf("wait for the server to be ready: %q %v", ready[:], err)
	}
	c.SetReadDeadline(time.Time{})
	return c, nil
}

// finishDrain half-closes a drained connection and checks that the server read every
// byte sent.
func finishDrain(c net.Conn, sent uint64) error {
	if err := c.(closeWriter).CloseWrite(); err != nil {
		return fmt.Errorf("close write: %w", err)
	}
	c.SetReadDeadline(time.Now().Add(finishTimeout))
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return fmt.Errorf("read the server's count: %w", err)
	}
	if got := binary.BigEndian.Uint64(ack[:]); got != sent {
		return fmt.Errorf("server read %d bytes, %d were sent", got, sent)
	}
	return nil
}

// runPingPong sends a p.Size-byte message and waits for its echo, one at a time.
func runPingPong(ctl Control, env *Env, p Params) (Metrics, error) {
	if env.Transport.Raw {
		return softPingPong(ctl, env, p.Size, env.Transport.Name == SoftVerbs3Copy)
	}
	c, err := env.open(context.Background(), roleEcho, p.Size)
	if err != nil {
		return Metrics{}, err
	}
	defer c.Close()
	buf := make([]byte, p.Size)
	roundTrip := func() error {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(c, buf)
		return err
	}
	// Warm up: rsock's client reads the server's hello answer in its first Read.
	for range warmupOps(p.Size) {
		if err := roundTrip(); err != nil {
			return Metrics{}, err
		}
	}
	rec := newRecorder()
	for ctl.Next() {
		start := time.Now()
		if err := roundTrip(); err != nil {
			return Metrics{}, err
		}
		rec.add(time.Since(start))
	}
	return Metrics{BytesPerOp: 2 * int64(p.Size), Latency: rec.percentiles()}, nil
}

// connsBatch is how many bytes one operation of the conns workload writes: enough that
// handing operations to the workers costs little.
const connsBatch = 256 << 10

// runConns streams on p.Conns connections at once. An operation is connsBatch bytes
// written in p.Size-byte writes on whichever connection's writer is free.
func runConns(ctl Control, env *Env, p Params) (Metrics, error) {
	if p.Conns < 1 {
		return Metrics{}, errors.New("conns: need at least one connection")
	}
	conns, err := openMany(p.Conns, func() (net.Conn, error) { return openDrain(env, p.Size) })
	if err != nil {
		return Metrics{}, err
	}
	defer closeAll(conns)
	writes := max(1, connsBatch/p.Size)
	bufs := make([][]byte, len(conns))
	sent := make([]uint64, len(conns))
	for i := range bufs {
		bufs[i] = make([]byte, p.Size)
	}
	err = fanOut(ctl, len(conns), func(w int) error {
		for range writes {
			n, err := conns[w].Write(bufs[w])
			sent[w] += uint64(n)
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Metrics{}, err
	}
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { errs[i] = finishDrain(c, sent[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Metrics{}, err
	}
	return Metrics{BytesPerOp: int64(writes * p.Size)}, nil
}

// openParallel is how many connections openMany dials at once.
const openParallel = 8

// openMany opens n connections with open, a few at a time.
func openMany(n int, open func() (net.Conn, error)) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	errs := make([]error, openParallel)
	var wg sync.WaitGroup
	for w := range openParallel {
		wg.Go(func() {
			for i := w; i < n; i += openParallel {
				c, err := open()
				if err != nil {
					errs[w] = fmt.Errorf("open connection %d of %d: %w", i+1, n, err)
					return
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeAll(conns)
		return nil, err
	}
	return conns, nil
}

// closeAll closes the connections, a few at a time (an rsock Conn's Close waits for its
// FIN to land).
func closeAll(conns []net.Conn) {
	var wg sync.WaitGroup
	for w := range openParallel {
		wg.Go(func() {
			for i := w; i < len(conns); i += openParallel {
				if conns[i] != nil {
					conns[i].Close()
				}
			}
		})
	}
	wg.Wait()
}

// runSetup opens connections one after the other and measures each from the start of
// its dial to the first byte from the server; then closes it.
func runSetup(ctl Control, env *Env, p Params) (Metrics, error) {
	rec := newRecorder()
	var one [1]byte
	for ctl.Next() {
		start := time.Now()
		c, err := env.open(context.Background(), roleFirst, 0)
		if err != nil {
			return Metrics{}, err
		}
		_, err = io.ReadFull(c, one[:])
		rec.add(time.Since(start))
		c.Close()
		if err != nil {
			return Metrics{}, fmt.Errorf("read first byte: %w", err)
		}
	}
	return Metrics{Latency: rec.percentiles()}, nil
}

package rsock

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// TestLoad runs many concurrent connections, each doing request/response rounds with
// an echo server and checking every reply: over soft RDMA, over TCP (RDMA disabled),
// and, where the build and the machine have one (-tags rdma, in the Soft-RoCE VM), over
// the default provider's device, so that the dials stampede on a real device. It is
// bounded in connections, rounds and time.
func TestLoad(t *testing.T) {
	// 1000 dials are four times the 256 handshakes a side runs at once, so dials queue
	// for a slot, and each connection's 5 rounds overlap the dials of others.
	// 20 rounds, as this test once did, only made it longer.
	conns, rounds := 1000, 5
	if testing.Short() {
		conns = 200
	}
	kinds := []string{"rdma", "tcp"}
	if p, err := defaultProvider(); err == nil {
		kinds = append(kinds, "default-"+p.Name())
	} else {
		t.Logf("no default provider here, soft and TCP only: %v", err)
	}
	for _, kind := range kinds {
		t.Run(fmt.Sprintf("%s/%d", kind, conns), func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := configs(t, FallbackTCP)
			want := TransportRDMA
			switch kind {
			case "rdma":
				scfg.Provider, ccfg.Provider = fab, fab
			case "tcp":
				scfg.DisableRDMA, ccfg.DisableRDMA = true, true
				want = TransportTCP
			}
			rounds := rounds
			// Small rings keep 2×conns endpoints modest; the default sizes work too.
			for _, c := range []*Config{scfg, ccfg} {
				c.RingSize, c.SendBufferSize, c.RecvWQEs = 16<<10, 8<<10, 16
				c.MaxConcurrentHandshakes = 256
				if c.Provider == nil && !c.DisableRDMA {
					// The default provider's device. What matters here is the burst of
					// dials; fewer rounds and a longer handshake bound keep the run
					// within its time on the emulated VM, where the device is slow.
					rounds = min(rounds, 5)
					c.HandshakeTimeout = time.Minute
				}
				if kind == "rdma" {
					// Each upgrade proves its path with a round trip through both
					// sides' pollers; a burst of 1000 of them on the emulated VM's two
					// CPUs outlasts the default 10 s for the last dials in line.
					c.HandshakeTimeout = time.Minute
				}
			}
			ln := listen(t, scfg)
			var byTransport sync.Map // the server's connections, by transport
			served := serveEcho(ln, &byTransport)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			d := &Dialer{Config: ccfg}
			var wg sync.WaitGroup
			errs := make(chan error, conns)
			for i := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := echoRounds(ctx, d, ln.Addr().String(), want, uint64(i), rounds); err != nil {
						errs <- fmt.Errorf("conn %d: %w", i, err)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			ln.Close()
			served.Wait()
			byTransport.Range(func(k, v any) bool {
				if n := v.(*atomic.Int64).Load(); k != want {
					t.Errorf("the server accepted %d connections on %s, want all on %s", n, k, want)
				}
				return true
			})
			requireReleased(t, fab)
		})
	}
}

// serveEcho echoes every connection ln accepts until ln closes. Wait on the result to
// know every echo has ended. Each accepted connection's transport is counted in
// byTransport, if it is not nil, before its echo starts.
func serveEcho(ln *Listener, byTransport ...*sync.Map) *sync.WaitGroup {
	var served sync.WaitGroup
	served.Add(1)
	go func() {
		defer served.Done()
		for {
			c, err := ln.AcceptRsock()
			if err != nil {
				return
			}
			for _, m := range byTransport {
				n, _ := m.LoadOrStore(c.Transport(), new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
			}
			served.Add(1)
			go func() {
				defer served.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return &served
}

// echoRounds dials, then sends rounds of random-sized requests and checks each echo.
func echoRounds(ctx context.Context, d *Dialer, addr, transport string, seed uint64, rounds int) error {
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	c := nc.(*Conn)
	defer c.Close()
	if c.Transport() != transport {
		return fmt.Errorf("transport %s (%v), want %s", c.Transport(), c.FallbackReason(), transport)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	req, resp := make([]byte, 4096), make([]byte, 4096)
	for r := range rounds {
		n := 1 + rng.IntN(len(req))
		for i := range req[:n] {
			req[i] = byte(rng.Uint32())
		}
		if _, err := c.Write(req[:n]); err != nil {
			return fmt.Errorf("round %d: write: %w", r, err)
		}
		if _, err := io.ReadFull(c, resp[:n]); err != nil {
			return fmt.Errorf("round %d: read: %w", r, err)
		}
		if !bytes.Equal(req[:n], resp[:n]) {
			return fmt.Errorf("round %d: echo differs", r)
		}
	}
	if err := c.CloseWrite(); err != nil {
		return err
	}
	if n, err := c.Read(resp); err != io.EOF {
		return fmt.Errorf("after CloseWrite: read %d, %v; want EOF", n, err)
	}
	return nil
}

// TestGarbageWhileServing sends a Listener random bytes, half hellos, oversized
// lengths and wrong magic from many connections while good clients keep doing echo
// rounds: every good client succeeds, over RDMA, and the bad ones cost nothing else.
func TestGarbageWhileServing(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	scfg.HandshakeTimeout = 2 * time.Second
	ln := listen(t, scfg)
	served := serveEcho(ln)

	good := rawHello(offerHello(nil))
	garbage := [][]byte{
		nil,                                     // connect and close
		[]byte("GET / HTTP/1.1\r\n\r\n"),        // wrong magic
		good[:5],                                // half a hello, then silence
		{0x89, 'R', 'S', 'K', 1, 1, 0xff, 0xff}, // oversized body length
		{0x89, 'R', 'S', 'K', 99, 1, 0, 4, 0, 0, 0, 0}, // unknown version
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 0))
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					continue
				}
				p := garbage[k%len(garbage)]
				if k%(len(garbage)+1) == len(garbage) {
					p = make([]byte, 1+rng.IntN(2048)) // random bytes
					for j := range p {
						p[j] = byte(rng.Uint32())
					}
				}
				c.Write(p)
				c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				io.Copy(io.Discard, c)
				c.Close()
			}
		}()
	}
	d := &Dialer{Config: ccfg}
	var goodWG sync.WaitGroup
	for i := range 20 {
		goodWG.Add(1)
		go func() {
			defer goodWG.Done()
			require.NoError(t, echoRounds(ctx, d, ln.Addr().String(), TransportRDMA, uint64(i), 20))
		}()
	}
	goodWG.Wait()
	close(stop)
	wg.Wait()
	ln.Close()
	served.Wait()
	requireReleased(t, fab)
}

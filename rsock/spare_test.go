package rsock

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs/soft"
)

// TestSpareServesNextClient: closing a connection the Listener accepted over RDMA
// prepares an endpoint for the next client, whose handshake takes it, charged to the
// client's budget; the Listener's Close releases it.
func TestSpareServesNextClient(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	ln := listen(t, scfg)

	c, s := pipe(t, ln, ccfg)
	require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
	require.Zero(t, ln.spare.qps(), "no spare before a connection closed")
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	ln.spare.settle()
	require.Equal(t, 1, ln.spare.qps(), "the server's Close prepared a spare")
	require.Eventually(t, func() bool { return fab.Stats().QPs == 1 }, 10*time.Second, time.Millisecond,
		"the spare's is the only QP left: %+v", fab.Stats())
	total, _, _ := ln.budget.held(netip.Prefix{})
	require.Zero(t, total.qps, "a spare is charged to nobody while it waits")

	c, s = pipe(t, ln, ccfg)
	require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
	exchangeSizes(t, c, s, 1000, 3)
	require.Zero(t, ln.spare.qps(), "the handshake took the spare")
	require.Equal(t, 2, fab.Stats().QPs, "one QP per end: the server's is the spare's, not a new one")
	key, _ := remoteKey(c.LocalAddr())
	total, remote, _ := ln.budget.held(key)
	require.Equal(t, 1, total.qps, "the spare is charged to the Listener once taken")
	require.Equal(t, total, remote, "and to the client's address %v", key)

	// A client's own Close prepares nothing: only the Listener's connections do.
	require.NoError(t, c.Close())
	ln.spare.settle()
	require.Zero(t, ln.spare.qps(), "a client's Close")
	require.NoError(t, s.Close())
	ln.spare.settle()
	require.Equal(t, 1, ln.spare.qps(), "the server's Close prepared the next spare")
	require.Eventually(t, func() bool {
		total, _, _ := ln.budget.held(key)
		return total.qps == 0
	}, 10*time.Second, time.Millisecond, "the taken spare refunded as its connection closed")

	require.NoError(t, ln.Close())
	require.Zero(t, ln.spare.qps(), "Close released the spare")
	requireReleased(t, fab)
}

// TestSpareTake: a spare is handed only to a client on the local address it was
// prepared for, and only if the client's budget takes its charge; one refused is
// released, charged to nobody.
func TestSpareTake(t *testing.T) {
	ip := netip.MustParseAddr("127.0.0.1")
	tests := []struct {
		name      string
		ip        netip.Addr
		budget    *countingBudget
		wantTaken bool
		wantKept  bool // the spare stays for another client
	}{
		{name: "same address, no budget", ip: ip, wantTaken: true},
		{name: "same address, budget grants", ip: ip, budget: &countingBudget{}, wantTaken: true},
		{name: "same address, budget refuses", ip: ip, budget: &countingBudget{refuse: true}},
		{name: "another address", ip: netip.MustParseAddr("127.0.0.2"), budget: &countingBudget{}, wantKept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			t.Cleanup(func() { rdma.CloseIdle(fab) })
			var s spareEndpoint
			ep, err := rdma.Prepare(fab, ip, rdma.Options{})
			require.NoError(t, err)
			s.ep, s.ip, s.idle = ep, ip, time.AfterFunc(time.Hour, func() {})
			defer s.idle.Stop()

			var budget rdma.Budget
			if tt.budget != nil {
				budget = tt.budget
			}
			got := s.take(tt.ip, budget)
			require.Equal(t, tt.wantTaken, got != nil, "taken")
			require.Equal(t, tt.wantKept, s.qps() == 1, "kept")
			switch {
			case got != nil:
				if tt.budget != nil {
					require.Equal(t, 1, tt.budget.qps, "the client's budget holds the spare's QP")
					require.Positive(t, tt.budget.bytes, "and its registered bytes")
				}
				require.NoError(t, got.Abort())
				if tt.budget != nil {
					require.Zero(t, *tt.budget, "refunded to the client's budget")
				}
			case tt.wantKept:
				s.close()
			default:
				require.Zero(t, tt.budget.qps, "a refused charge holds nothing")
				require.Zero(t, tt.budget.bytes, "a refused charge holds nothing")
			}
			require.Zero(t, fab.Stats().QPs, "every QP released")
		})
	}
}

// TestSpareTakeWaitsForRefill: a client that comes while a refill for its local address
// is under way waits for it and takes its endpoint, rather than preparing a second one
// beside it; a refill for another address is not waited for.
func TestSpareTakeWaitsForRefill(t *testing.T) {
	ip := netip.MustParseAddr("127.0.0.1")
	fab := soft.New(soft.Options{})
	t.Cleanup(func() { rdma.CloseIdle(fab) })
	ep, err := rdma.Prepare(fab, ip, rdma.Options{})
	require.NoError(t, err)
	synctest.Test(t, func(t *testing.T) {
		var s spareEndpoint
		s.filling, s.fillIP, s.filled = true, ip, sync.NewCond(&s.mu)
		s.idle = time.AfterFunc(time.Hour, func() {})
		defer s.idle.Stop()
		require.Nil(t, s.take(netip.MustParseAddr("127.0.0.2"), nil), "a client on another address")

		got := make(chan *rdma.Endpoint, 1)
		go func() { got <- s.take(ip, nil) }()
		synctest.Wait()
		select {
		case e := <-got:
			t.Fatalf("take returned %v while the refill for its address was under way", e)
		default:
		}
		s.install(ep, ip) // the refill's end
		require.Same(t, ep, <-got, "the client takes the refill's endpoint")
		require.Zero(t, s.qps(), "handed over")
	})
	require.NoError(t, ep.Abort())
	require.Zero(t, fab.Stats().QPs, "every QP released")
}

// TestSpareExpire: the idle timer's callback releases a spare whose wait is over, and
// leaves one made since (a callback under way as fill reset the timer).
func TestSpareExpire(t *testing.T) {
	fab := soft.New(soft.Options{})
	t.Cleanup(func() { rdma.CloseIdle(fab) })
	ep, err := rdma.Prepare(fab, netip.MustParseAddr("127.0.0.1"), rdma.Options{})
	require.NoError(t, err)
	var s spareEndpoint
	s.ep, s.until = ep, time.Now().Add(time.Hour)
	s.expire()
	require.Equal(t, 1, s.qps(), "a spare whose wait is not over stays")
	s.until = time.Now()
	s.expire()
	require.Zero(t, s.qps(), "one whose wait is over is released")
	require.Zero(t, fab.Stats().QPs, "with its QP")
	s.expire() // nothing left: nothing happens
}

// TestCloseIdleDevicesReleasesSpare: CloseIdleDevices releases a Listener's spare,
// whose device would otherwise stay open, and the Listener prepares the next one when
// another of its connections closes.
func TestCloseIdleDevicesReleasesSpare(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	ln := listen(t, scfg)
	for range 2 {
		c, s := pipe(t, ln, ccfg)
		require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
		require.NoError(t, c.Close())
		require.NoError(t, s.Close())
		ln.spare.settle()
		require.Equal(t, 1, ln.spare.qps(), "the spare")
		require.NoError(t, CloseIdleDevices())
		require.Zero(t, ln.spare.qps(), "CloseIdleDevices released the spare")
		require.Eventually(t, func() bool { return fab.Stats().CQs == 0 }, 10*time.Second, time.Millisecond,
			"and the device it kept open: %+v", fab.Stats())
	}
}

// TestSpareUnderChurn dials, accepts and closes connections from several goroutines at
// once while CloseIdleDevices runs, then closes the Listener: every connection
// upgrades, and the spares taken, made, expired and released leave nothing behind
// (run with -race).
func TestSpareUnderChurn(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	ln := listen(t, scfg)
	const dialers, each = 4, 25
	var wg sync.WaitGroup
	errs := make(chan error, dialers*each)
	for range dialers {
		wg.Go(func() {
			for range each {
				c, err := Dial("tcp", ln.Addr().String(), ccfg)
				if err != nil {
					errs <- err
					return
				}
				s, err := ln.AcceptRsock() // another dialer's, maybe: all are closed alike
				if err != nil {
					c.Close()
					errs <- err
					return
				}
				if c.Transport() != TransportRDMA {
					errs <- fmt.Errorf("not upgraded: %v", c.FallbackReason())
				}
				c.Close()
				s.Close()
			}
		})
	}
	done := make(chan struct{})
	var idle sync.WaitGroup
	idle.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if err := CloseIdleDevices(); err != nil {
				errs <- err
				return
			}
			runtime.Gosched()
		}
	})
	wg.Wait()
	close(done)
	idle.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, ln.Close())
	require.Zero(t, ln.spare.qps(), "no spare after Close")
	requireReleased(t, fab)
}

// countingBudget is an rdma.Budget that counts what it holds and refuses every charge
// while refuse is set.
type countingBudget struct {
	refuse     bool
	qps, bytes int
}

func (b *countingBudget) Charge(qps, bytes int) error {
	if b.refuse {
		return errors.New("refused")
	}
	b.qps += qps
	b.bytes += bytes
	return nil
}

func (b *countingBudget) Refund(qps, bytes int) {
	b.qps -= qps
	b.bytes -= bytes
}

// settle waits for a refill under way to end.
func (s *spareEndpoint) settle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waitFill()
}

// qps is the queue pairs the spare holds: 1 or 0.
func (s *spareEndpoint) qps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ep == nil {
		return 0
	}
	return 1
}

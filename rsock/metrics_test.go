package rsock

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs/soft"
)

// published reads the expvar variable as a client of /debug/vars would.
func published(t *testing.T) map[string]map[string]int64 {
	t.Helper()
	v := expvar.Get(expvarName)
	require.NotNil(t, v, "expvar %q is published", expvarName)
	var m map[string]map[string]int64
	require.NoError(t, json.Unmarshal([]byte(v.String()), &m), "expvar %q: %s", expvarName, v.String())
	return m
}

// delta returns after minus before, key by key, leaving out zeros.
func delta(before, after map[string]map[string]int64) map[string]map[string]int64 {
	d := make(map[string]map[string]int64)
	for group, keys := range after {
		for k, v := range keys {
			if diff := v - before[group][k]; diff != 0 {
				if d[group] == nil {
					d[group] = make(map[string]int64)
				}
				d[group][k] = diff
			}
		}
	}
	return d
}

// TestMetricsMixedLoad opens connections of every kind, one after the other, and
// checks what the expvar variable says about them, while they are open and once they
// are closed.
func TestMetricsMixedLoad(t *testing.T) {
	fab := soft.New(soft.Options{})
	before := published(t)
	var conns []*Conn
	keep := func(cs ...*Conn) { conns = append(conns, cs...) }

	// RDMA both ways.
	rs, rc := rdmaConfigs(t, FallbackTCP, fab)
	rdmaLn := listen(t, rs)
	c, s := pipe(t, rdmaLn, rc)
	require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
	exchangeSizes(t, c, s, 1000, 10)
	keep(c, s)

	// No provider on either side (and no shared memory): the client has none, the
	// server sees no offer.
	plainLn := listen(t, &Config{DisableSHM: true, DisableRDMA: true})
	c, s = pipe(t, plainLn, &Config{DisableSHM: true, DisableRDMA: true})
	exchangeSizes(t, c, s, 20, 2)
	keep(c, s)

	// A client with a provider, a server without: the server declines.
	c, s = pipe(t, plainLn, &Config{Provider: fab, DisableSHM: true})
	require.ErrorIs(t, c.FallbackReason(), ErrPeerDeclined)
	exchangeSizes(t, c, s, 300, 3)
	keep(c, s)

	// QUIC, no provider.
	qs, qc := plainConfigs(t, FallbackQUIC)
	quicLn := listen(t, qs)
	c, s = pipe(t, quicLn, qc)
	exchangeSizes(t, c, s, 4000, 40)
	keep(c, s)

	// A plain TCP client, served as one.
	open := listen(t, &Config{AcceptPlainClients: true})
	raw, err := net.Dial("tcp", open.Addr().String())
	require.NoError(t, err)
	_, err = raw.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	require.NoError(t, err)
	s, err = open.AcceptRsock()
	require.NoError(t, err)
	_, err = io.ReadFull(s, make([]byte, 18))
	require.NoError(t, err)
	keep(s)

	// A plain TCP client refused: a failed handshake.
	refused, err := net.Dial("tcp", plainLn.Addr().String())
	require.NoError(t, err)
	_, err = refused.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	require.NoError(t, err)
	_, err = io.ReadAll(refused) // the Listener closes it
	refused.Close()
	t.Logf("the refused plain client read: %v", err)
	require.Eventually(t, func() bool {
		return published(t)["handshake_failures"]["not_rsock"] > before["handshake_failures"]["not_rsock"]
	},
		10*time.Second, time.Millisecond, "the refused client is counted")

	d := delta(before, published(t))
	require.Equal(t, map[string]int64{TransportRDMA: 2, TransportTCP: 5, TransportQUIC: 2}, d["conns_opened"], "all: %v", d)
	require.Equal(t, d["conns_opened"], d["conns_open"], "all: %v", d)
	require.Equal(t, map[string]int64{
		"no_provider":          3, // the TCP and QUIC clients, and the server that declined
		"peer_offered_none":    2, // the TCP and QUIC servers, offered nothing
		"declined_no_provider": 1, // the client with a provider
		"plain_client":         1,
	}, d["fallbacks"], "all: %v", d)
	require.Equal(t, map[string]int64{"not_rsock": 1}, d["handshake_failures"], "all: %v", d)
	require.Equal(t, map[string]int64{TransportRDMA: 1010, TransportTCP: 20 + 2 + 300 + 3 + 18, TransportQUIC: 4040}, d["bytes_read"], "all: %v", d)
	// The plain client's 18 bytes were read by an rsock Conn, written by a net.Conn.
	require.Equal(t, map[string]int64{TransportRDMA: 1010, TransportTCP: 20 + 2 + 300 + 3, TransportQUIC: 4040}, d["bytes_written"], "all: %v", d)

	for _, c := range conns {
		c.Close()
	}
	raw.Close()
	d = delta(before, published(t))
	require.Empty(t, d["conns_open"], "after Close: %v", d)
	require.Equal(t, map[string]int64{TransportRDMA: 1010, TransportTCP: 343, TransportQUIC: 4040}, d["bytes_read"], "after Close, closed connections' bytes: %v", d)
	for _, ln := range []*Listener{rdmaLn, plainLn, quicLn, open} {
		require.NoError(t, ln.Close())
	}
	requireReleased(t, fab)
}

func TestReasonIndex(t *testing.T) {
	for _, tc := range []struct {
		reason error
		key    string
		peer   bool
	}{
		{&FallbackError{Err: ErrNoProvider}, "no_provider", false},
		{&FallbackError{Peer: true, Err: ErrNoDevice}, "no_device", true},
		{&FallbackError{Err: fmt.Errorf("%w: 3 GiB of 2 GiB", ErrMemoryBudget)}, "memory_budget", false},
		{&FallbackError{Err: fmt.Errorf("%w: 10 connections", ErrResourcesExhausted)}, "resources", false},
		{&FallbackError{Err: ErrPlainClient}, "plain_client", false},
		{&FallbackError{Err: fmt.Errorf("%w: no message", ErrPathUnproven)}, "path_unproven", false},
		{&FallbackError{Peer: true, Err: ErrVersionMismatch}, "version_mismatch", true},
		{errors.New("something new"), "other", false},
		{nil, "other", false},
	} {
		i, peer := reasonIndex(tc.reason)
		if reasonKeys[i].key != tc.key || peer != tc.peer {
			t.Errorf("reasonIndex(%v) = %q, peer %v; want %q, peer %v", tc.reason, reasonKeys[i].key, peer, tc.key, tc.peer)
		}
	}
}

func TestCauseIndex(t *testing.T) {
	for _, tc := range []struct {
		err error
		key string
	}{
		{fmt.Errorf("client hello: %w: first bytes", ErrNotRsockPeer), "not_rsock"},
		{fmt.Errorf("client hello: %w", ErrBadHello), "bad_hello"},
		{fmt.Errorf("read: %w", os.ErrDeadlineExceeded), "timeout"},
		{context.DeadlineExceeded, "timeout"},
		{context.Canceled, "canceled"},
		{fmt.Errorf("client hello: %w", io.ErrUnexpectedEOF), "peer_closed"},
		{&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, "peer_closed"},
		{errors.New("tls: bad certificate"), "other"},
	} {
		if got := causeKeys[causeIndex(tc.err)].key; got != tc.key {
			t.Errorf("causeIndex(%v) = %q, want %q", tc.err, got, tc.key)
		}
	}
}

// TestMetricsDoNotPinConns: a Conn its program drops without closing it is not kept
// alive by the process-wide counters.
func TestMetricsDoNotPinConns(t *testing.T) {
	// On TCP: a dropped connection's socket is the runtime's to close, while a dropped
	// shm connection's provider goroutines would outlive the test.
	ln := listen(t, &Config{DisableSHM: true, DisableRDMA: true})
	c, s := pipe(t, ln, &Config{DisableSHM: true, DisableRDMA: true})
	dropped := weak.Make(c)
	c = nil
	for range 10 {
		if dropped.Value() == nil {
			break
		}
		runtime.GC()
	}
	require.Nil(t, dropped.Value(), "an unreferenced Conn was collected")
	published(t) // the snapshot skips it
	require.NoError(t, s.Close())
	require.NoError(t, ln.Close())
}

// TestMetricsMappings: the expvar variable publishes the memory mappings rsock's
// providers hold and the most they may hold. A same-host connection holds some while it
// is open, and none once it closed. It runs in a child process, whose mappings are all
// this test's.
func TestMetricsMappings(t *testing.T) {
	if !inChild(t) {
		return
	}
	require.Equal(t, map[string]int64{"held": 0, "budget": vma.Budget()}, published(t)["memory_mappings"])
	require.Positive(t, vma.Budget())
	ln := listen(t, nil)
	c, s := pipe(t, ln, nil)
	require.Equal(t, TransportSHM, c.Transport(), "client: %v", c.FallbackReason())
	requireEcho(t, c, s)
	held := published(t)["memory_mappings"]["held"]
	require.Equal(t, vma.Held(), held)
	require.Positive(t, held, "an open same-host connection")
	c.Close()
	s.Close()
	require.NoError(t, ln.Close())
	require.Eventually(t, func() bool {
		rdma.CloseIdle(nil)
		return published(t)["memory_mappings"]["held"] == 0
	}, 30*time.Second, time.Millisecond, "every mapping given back")
}

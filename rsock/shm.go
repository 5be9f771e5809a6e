package rsock

import (
	"fmt"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
)

// Same host: two processes of one host connect through shared memory rather than a NIC
// or TCP. The client offers it when its bootstrap connection's peer is on this host
// (reached over loopback, or at this side's own address) and no provider is configured
// (Config.Provider nil: an explicit provider is the user's choice); its offer then
// carries capSHM, and its endpoint is a QP of the same-host provider (verbs/auto's
// SameHost, verbs/shm). The server answers in kind, or declines with its reason. The
// path is proven as any RDMA path is (proof.go): the proof can cross only if the
// client's QP reached the Unix socket the server's QP listens on, in the same network
// namespace, as the same user (SO_PEERCRED); shm then passes its regions' memfds over
// that socket. A connection upgraded this way reports Transport() == TransportSHM.

// TransportSHM is the transport of a connection between two processes of one host
// through shared memory.
const TransportSHM = "shm"

// capSHM, in an offer or accept that has capRDMA, says that the RDMA endpoint is a QP of
// the same-host shared-memory provider. Version 2 peers that predate it ignore it as a
// reserved bit, and their proof fails: such a client or server falls back with a reason.
const capSHM helloCaps = 1 << 1

// offersSHM reports whether an offer's or accept's RDMA endpoint is on shared memory.
func (h hello) offersSHM() bool { return h.caps&(capRDMA|capSHM) == capRDMA|capSHM }

// errSHMDisabled is the reason a server gives for declining a same-host offer.
var errSHMDisabled = fmt.Errorf("%w: same-host shared memory disabled (Config.DisableSHM, DisableRDMA, an explicit Provider or a QUIC bootstrap)", ErrNoProvider)

// sameHostProvider returns the provider of a same-host upgrade for boot, or nil when
// there is none: shm disabled, a provider configured, an encrypted bootstrap (QUIC: it
// stays encrypted), or a peer elsewhere. The error is why a same-host connection has
// none (the process is out of file descriptors, say): it falls back with it as its
// reason rather than try the other providers' devices, so that the reason says so.
func (c *Config) sameHostProvider(boot bootConn) (verbs.Provider, error) {
	if c.DisableRDMA || c.DisableSHM || c.Provider != nil || c.Fallback == FallbackQUIC || !sameHost(boot) {
		return nil, nil
	}
	p, err := auto.SameHost()
	if err != nil {
		return nil, fmt.Errorf("%w: same-host shared memory: %w", ErrNoProvider, err)
	}
	return p, nil
}

// A same-host connection whose Config leaves the ring and staging sizes to the
// defaults gets a fixed ring of sameHostRingSize and a staging buffer of
// sameHostSendBuffer, rather than the RDMA defaults (a ring growing from 8 KiB to
// 4 MiB, staging to 256 KiB). Shared memory is not pinned, and its pages are taken only
// as the stream first touches them, so an end that never streams holds little of it;
// one that did keeps its 3 MiB until it closes (a fixed ring does not shrink when
// idle). It is charged in full
// to the registered-memory limits (Config.MaxRegisteredMemory, and the Listener's
// MaxRegisteredMemoryPerRemote and MaxRegisteredMemoryPerListener); a connection the
// limits refuse it gets the ordinary growing ring instead, still on shared memory
// (prepareEndpoint), and falls back to TCP only if that does not fit either.
//
// A Listener gives the large ring only while the connections' registered memory stays
// within half of its limits (largeRingFits): every client of a same-host Listener
// comes from one remote address, and at the default 2 GiB per remote address the large
// rings alone had taken it all by some 680 connections, so that the 850th, idle or not,
// fell back to TCP (rsockperf -mode idle, 5,000 connections). Now some 340 connections
// get the large ring, and the other half of the limit holds ordinary rings: tens of
// thousands idle, each growing as far as the limit lets it when it streams.
//
// Why these sizes, measured on a 2-core EPYC with 2 MiB of L2 per core: moving 64 KiB
// writes through a bare shared ring with two copies (verbs/shm's BenchmarkBoundRing)
// ran, on a quiet host, at 1.6x a Unix socket with a 512 KiB ring, 2.8x with 1 MiB and
// 6x with 2 MiB; within a core's L2, the writer's copy waits on lines the reader's core
// still holds (a 64 KiB copy took 27 us with a 256 KiB ring, 1.4 us from 1 MiB on).
// rsockperf's 64 KiB stream, at the median of five or six quiet runs: 1.5x Unix with the
// growing ring, 2.1x with a 1 MiB ring and 1 MiB of staging, 2.8x with 2 MiB and 512
// KiB, 3.1x with 2 MiB and 1 MiB, 3.0x with 4 MiB and 1 MiB.
const (
	sameHostRingSize   = 2 << 20
	sameHostSendBuffer = 1 << 20
)

// sameHostOptions applies those defaults to engine options o, and waits for the peer's
// acknowledgements without an ACK timeout (rdma.Options.NoACKTimeout): on shared memory
// the peer's process, not a device, acknowledges, and on a loaded host its answers to
// hundreds of streaming connections came later than the half second that fails a QP
// ("transport retry counter exceeded"); its death is seen at once on the Unix socket,
// and a peer that lives but answers nothing still meets the engine's silence bound.
func sameHostOptions(o rdma.Options) rdma.Options {
	o = sameHostSmallOptions(o)
	if o.RingSize == 0 && o.GrowRingTo == 0 {
		o.RingSize = sameHostRingSize
	}
	if o.SendBufferSize == 0 {
		o.SendBufferSize = sameHostSendBuffer
	}
	return o
}

// largeRingFits reports whether a same-host connection charging budget (a Listener's,
// nil on a client's side) may take the large ring sameHostOptions gives engine options
// o: always when o's sizes are the Config's own (sameHostOptions keeps them) or nothing
// bounds the connection, else only while the ring and its staging leave half of the
// Listener's registered-memory limits free (remoteBudget.leavesHalf). It is a check, not
// a reservation: handshakes under way at once may each pass it, and go past half by a
// large ring each; the limits themselves are still enforced by the budget's Charge.
func largeRingFits(budget rdma.Budget, o rdma.Options) bool {
	large, small := sameHostOptions(o), sameHostSmallOptions(o)
	if large.RingSize == small.RingSize && large.SendBufferSize == small.SendBufferSize {
		return true
	}
	r, ok := budget.(*remoteBudget)
	return !ok || r.leavesHalf(int64(large.RingSize+large.SendBufferSize))
}

// sameHostSmallOptions are the options of a same-host connection whose ring of
// sameHostRingSize did not fit a memory limit (prepareEndpoint): the Config's sizes, a
// growing ring by default, still without an ACK timeout. sameHostOptions starts from
// them.
func sameHostSmallOptions(o rdma.Options) rdma.Options {
	o.NoACKTimeout = true
	return o
}

// sameHost reports whether boot's peer is on this host: a loopback address, or this
// side's own address.
func sameHost(boot bootConn) bool {
	r := addrOf(boot.RemoteAddr())
	return r.IsValid() && (r.IsLoopback() || r == addrOf(boot.LocalAddr()))
}

// newUpgradedConn returns the Conn of an upgrade that moved the data path to RDMA or
// shared memory.
func newUpgradedConn(boot bootConn, up upgrade) *Conn {
	c := newRDMAConn(boot, up.data)
	if up.shm {
		c.transport = TransportSHM
	}
	return c
}

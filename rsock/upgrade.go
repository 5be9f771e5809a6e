package rsock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs"
)

// This file is the seam between the connection setup and the RDMA stream engine.
// Everything RDMA-specific that the setup needs goes through offerRDMA (client side)
// and acceptRDMA (server side); the rest of the package knows nothing of queue pairs.
//
// Both run on the bootstrap connection (TCP or QUIC) before the Conn exists, with the
// connection's deadline set to the end of the handshake and ctx ending with it (or when
// the Dial is cancelled, or the Listener closes). Both return an upgrade:
//
//   - data non-nil: the upgrade succeeded. The Conn moves its bytes through data and
//     keeps the bootstrap connection open as the control channel; Conn.Close closes
//     data, then the bootstrap connection.
//   - data nil: the connection stays on the bootstrap transport, and reason (a
//     *FallbackError) says why. replied tells whether the hello exchange has already
//     taken place. If not, the caller completes it: the client sends an offer without
//     RDMA (and reads the server's answer lazily, at the first Read), the server
//     declines with declineReasonOf(reason).
//
// After an accept, the two sides prove the path and bind it to this bootstrap
// connection (proof.go), then the client confirms with one byte on the bootstrap
// connection:
//
//  1. The server connects its QP to the client's before it sends the accept, and the
//     accept carries a fresh nonce, as the offer did.
//  2. The client connects its QP and sends its proof (role C, both nonces, its ring's
//     address and rkey) over it, then waits for the server's proof over its QP, at most
//     half what is left of the handshake (pathProofTimeout without a deadline).
//  3. The server, on the client's proof over its QP, checks that it echoes this
//     connection's nonces and answers with its own proof (role S, its ring).
//  4. The client, on a server's proof that echoes its nonces, confirms with
//     confirmReady; on none in time, a failed QP or a proof that does not bind, with
//     confirmUnproven, and both stay on the bootstrap transport with ErrPathUnproven.
//     A client that could not connect its QP at all confirms with confirmFailed (the
//     server's reason is then ErrUpgradeFailed from the peer).
//  5. The server follows the confirmation, and treats the connection as RDMA only on
//     confirmReady after a proof that bound: a confirmReady without one (a replayed
//     hello, a client that skips the proof) fails the handshake, and the Listener
//     keeps serving.
//
// No application byte goes over RDMA before step 4: the client's data follows its
// confirmReady, and the server's the confirmation it read. Each ring is revealed only
// in a proof, over a QP whose peer proved it saw this connection's hellos. The server
// watches the bootstrap connection for the confirmation while it waits for the proof,
// so a client that gives up early is followed at once.

// Confirmation bytes, sent by the client after an accept.
const (
	confirmReady    = 'R'
	confirmFailed   = 'F'
	confirmUnproven = 'P'
)

// pathProofTimeout bounds the client's wait for the server's proof when its handshake
// has no deadline; with one, the wait is half what is left of it (5 s of the default
// 10 s), so that a loaded machine's slow proof is not taken for a broken path and the
// fallback still completes within the handshake. A path that drops RoCE fails much
// sooner: the client's proof runs out of transport retries (eight tries of about 67 ms)
// and the wait ends with that failure.
const pathProofTimeout = 5 * time.Second

// upgrade is the outcome of offerRDMA or acceptRDMA.
type upgrade struct {
	data    stream // the RDMA data path, or nil
	shm     bool   // data runs on the same-host shared-memory provider (shm.go)
	reason  error  // why not RDMA, when data is nil
	replied bool   // the hello exchange is complete
}

// dialState is the client side of a connection being set up.
type dialState struct {
	cfg       *Config  // resolved
	boot      bootConn // the bootstrap connection; no hello has been sent on it yet
	transport string   // TransportTCP or TransportQUIC

	// magicSent is set once the hello's magic has gone out ahead of the rest of the
	// hello (sendMagic); sendHello then sends the rest.
	magicSent bool

	// Buffers for the hello out and the server's in, kept here so that a dial
	// allocates the state once rather than each buffer.
	out [helloMaxLen]byte
	in  helloReader
	// spin reads the server's answer (bootspin.go).
	spin bootSpin
	// hctx is the handshake's context (clientHandshake), here for the same reason.
	hctx handshakeCtx
	// config holds the dial's resolved Config (DialRsock), which cfg points to unless
	// the dial had to copy it again (withServerName).
	config Config
}

// sendMagic sends the hello's first bytes, its magic, before the device preparation,
// which can take long on a real device (listing, opening, registering). A Listener
// with AcceptPlainClients decides within PlainSniffTimeout whether a client is plain
// by its first bytes; with the magic in, it waits for the rest of the hello within
// the handshake timeout instead. The bytes on the wire are the same hello, only sent
// in two writes.
func (d *dialState) sendMagic() error {
	if _, err := d.boot.Write(helloMagic[:]); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	d.magicSent = true
	return nil
}

// deviceCold reports whether this side would prepare an RDMA endpoint on a device that
// is not warm (rdma.Warm): one whose listing or opening can take long. Without a
// provider, or with a warm device, the hello goes out in one write. shm, when not nil, is
// the same-host provider this dial uses in place of Config's. A default provider not
// found yet counts as cold: finding it lists and opens devices (verbs/auto), which on
// a slow host took longer than a Listener's PlainSniffTimeout.
func (d *dialState) deviceCold(shm verbs.Provider) bool {
	p := shm
	if p == nil {
		if !d.cfg.providerKnown() {
			return true
		}
		var err error
		if p, err = d.cfg.provider(); err != nil {
			return false
		}
	}
	ip, ok := localIP(d.boot)
	return ok && !rdma.Warm(p, ip, d.cfg.rdmaOptions())
}

// sendHello sends h, or what of it follows the magic when sendMagic sent that already.
func (d *dialState) sendHello(h hello) error {
	b := h.appendTo(d.out[:0])
	if d.magicSent {
		b = b[len(helloMagic):]
	}
	if _, err := d.boot.Write(b); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	return nil
}

// offerRDMA tries to upgrade a dialed connection to RDMA. It runs before any hello was
// sent. To upgrade, it prepares this side's RDMA endpoint (on a cold device, after
// sending the hello's magic: see sendMagic), sends an offer with it, waits for the
// server's answer, connects the queue pairs and proves the path.
func (d *dialState) offerRDMA(ctx context.Context) (upgrade, error) {
	shm, err := d.cfg.sameHostProvider(d.boot)
	if err != nil {
		return upgrade{reason: &FallbackError{Err: err}}, nil
	}
	if d.deviceCold(shm) {
		if err := d.sendMagic(); err != nil {
			return upgrade{}, err
		}
	}
	ep, reason, err := prepareEndpoint(ctx, d.cfg, d.boot, nil, shm)
	if err != nil {
		return upgrade{}, err
	}
	if reason != nil {
		return upgrade{reason: reason}, nil
	}
	mine := ep.Offer()
	offer := endpointOf(mine, newNonce())
	if dialAsBeforeUnitRing {
		offer.UnitRingSize = 0 // and with it the field after it
	}
	if dialAsBeforeWQEGrowth {
		offer.GrowRecvWQEsTo = 0
	}
	oh := offerHello(&offer)
	if shm != nil {
		oh.caps |= capSHM
	}
	if mine.Place {
		oh.caps |= capPlace
	}
	if err := d.sendHello(oh); err != nil {
		ep.Abort()
		return upgrade{}, err
	}
	d.spin.init(d.boot, d.cfg.PollSpin) // bootspin.go: the answer comes soon
	h, err := d.in.read(&d.spin)
	switch {
	case errors.Is(err, ErrVersionMismatch) && h.kind == helloDecline:
		ep.Abort()
		return upgrade{reason: &FallbackError{Peer: true, Err: err}, replied: true}, nil
	case err != nil:
		ep.Abort()
		return upgrade{}, fmt.Errorf("server hello: %w", err)
	case h.kind == helloDecline:
		ep.Abort()
		return upgrade{reason: &FallbackError{Peer: true, Err: h.reason.err()}, replied: true}, nil
	case h.kind != helloAccept || !h.offersRDMA() || h.offersSHM() != (shm != nil):
		ep.Abort()
		return upgrade{}, fmt.Errorf("server hello: %w: an %v where an answer belongs", ErrBadHello, h.kind)
	}
	server := offerOf(h.rdma)
	server.Place = mine.Place && h.caps&capPlace != 0
	if dialAsBeforeUnitRing {
		server.UnitRingSize = 0
	}
	if dialAsBeforeUnitRing || dialAsBeforeWQEGrowth {
		server.GrowRecvWQEsTo = 0
	}
	conn, err := ep.Connect(server, d.boot, d.cfg.rdmaKeepAlive())
	if err != nil {
		ep.Abort()
		if _, werr := d.boot.Write([]byte{confirmFailed}); werr != nil {
			return upgrade{}, fmt.Errorf("send confirmation: %w", werr)
		}
		return upgrade{reason: &FallbackError{Err: connectReason(err)}, replied: true}, nil
	}
	conn.UseControlSocket(d.spin.raw) // the socket's handle, made once for both
	peer, why, err := proveClient(ctx, conn, &proof{
		role: roleClient, client: offer.Nonce, server: h.rdma.Nonce, ringRKey: mine.RingRKey, ringAddr: mine.RingAddr,
	}, unprovenHint(shm != nil))
	if err != nil {
		conn.Abandon()
		return upgrade{}, err
	}
	if why != nil {
		conn.Abandon()
		if _, werr := d.boot.Write([]byte{confirmUnproven}); werr != nil {
			return upgrade{}, fmt.Errorf("send confirmation: %w", werr)
		}
		return upgrade{reason: &FallbackError{Err: why}, replied: true}, nil
	}
	conn.SetPeerRing(peer.ringAddr, peer.ringRKey)
	if _, err := d.boot.Write([]byte{confirmReady}); err != nil {
		conn.Abandon()
		return upgrade{}, fmt.Errorf("send confirmation: %w", err)
	}
	conn.Start()
	return upgrade{data: conn, shm: shm != nil}, nil
}

// proveClient sends the client's proof mine over conn and waits for the server's. It
// returns the server's proof, or why the path is unproven (an error matching
// ErrPathUnproven, ending with hint: unprovenHint), or an error when ctx ends first (the
// handshake is over).
func proveClient(ctx context.Context, conn *rdma.Conn, mine *proof, hint string) (peer proof, why, err error) {
	var buf [proofLen]byte // SendProof copies it
	if err := conn.SendProof(mine.appendTo(buf[:0])); err != nil {
		return proof{}, fmt.Errorf("%w: send the proof: %w", ErrPathUnproven, err), nil
	}
	if conn.SpinProof() { // the common case, where the peer answers at once: no timer
		return checkServerProof(conn, mine, hint)
	}
	wait := pathProofTimeout
	if dl, ok := ctx.Deadline(); ok {
		// Leave the other half for the confirmation and the server's fallback.
		wait = time.Until(dl) / 2
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-parentDone(ctx): // the handshake's own deadline is later than t's
		return proof{}, nil, fmt.Errorf("prove the rdma path: %w", ctx.Err())
	case <-t.C:
		return proof{}, fmt.Errorf("%w: no RDMA message from the peer within %v: %s", ErrPathUnproven, wait.Round(time.Millisecond), hint), nil
	case <-conn.ProofDone():
	}
	return checkServerProof(conn, mine, hint)
}

// unprovenHint is what a reason for an unproven path asks the operator to check. Over
// RDMA, it is the network: RoCE's port filtered, or its packets routed elsewhere. On
// shared memory (shm), the proof crosses the Unix socket the peer's QP listens on, and
// what keeps it from there is the peer's process: out of open files (each same-host
// connection end holds several), or in another network namespace, whose abstract Unix
// sockets are apart, or run by another user.
func unprovenHint(shm bool) string {
	if shm {
		return "is either process out of open files (RLIMIT_NOFILE), or are they in different network namespaces or run by different users?"
	}
	return "is RoCE (UDP 4791) blocked or routed elsewhere?"
}

// checkServerProof reads the server's proof off conn, whose ProofDone is closed, and
// checks it binds to the client's proof mine: see proveClient.
func checkServerProof(conn *rdma.Conn, mine *proof, hint string) (peer proof, why, err error) {
	b, err := conn.Proof()
	if err != nil {
		return proof{}, fmt.Errorf("%w: the first RDMA message between the peers failed: %w: %s", ErrPathUnproven, err, hint), nil
	}
	if peer, err = decodeProof(b); err == nil {
		err = peer.binds(roleServer, mine.client, mine.server)
	}
	if err != nil {
		return proof{}, err, nil
	}
	return peer, nil, nil
}

// acceptState is the server side of a connection being set up.
type acceptState struct {
	cfg       *Config  // resolved
	boot      bootConn // the bootstrap connection; the client's offer has been read
	transport string   // TransportTCP or TransportQUIC

	// budget is charged for the endpoint: the Listener's, seen from the client's
	// address (limits.go).
	budget rdma.Budget
	// spare is the Listener's endpoint prepared ahead (spare.go), which prepareEarly
	// takes if it suits; nil: none.
	spare *spareEndpoint

	// What prepareEarly made, until acceptRDMA takes it (early then turns false) or
	// abortEarly releases it.
	early    bool
	earlyEP  *rdma.Endpoint
	earlyWhy error // prepareEndpoint's reason
	earlyErr error // prepareEndpoint's error

	ans  proofAnswer // the answer to the client's proof (acceptRDMA)
	spin bootSpin    // reads the client's confirmation (bootspin.go)

	// The Listener's handshake (handshake.go) keeps its hello reader and context here,
	// in the allocation it makes for the accept state anyway.
	hr   helloReader
	hctx handshakeCtx
}

// prepareEarly prepares this side's endpoint before the client's offer is read, or
// takes the Listener's spare (spare.go), when the device is warm (rdma.Warm: no
// listing, no opening, only the connection's own verbs calls), so that the preparation
// overlaps the client's own and the offer's journey instead of following them. An
// endpoint prepared for a client that then offers no RDMA is released by abortEarly;
// meanwhile it is charged to the client's budget as any endpoint is, for no longer
// than the handshake. On a cold device, or where this side could not offer RDMA
// anyway, nothing is prepared ahead: a Listener whose clients never upgrade keeps its
// device cold and never pays for it. Nor for a client on this host, which may offer
// shared memory instead (sameHostProvider).
func (a *acceptState) prepareEarly(ctx context.Context) {
	if shm, err := a.cfg.sameHostProvider(a.boot); shm != nil || err != nil {
		return
	}
	p, err := a.cfg.provider()
	if err != nil {
		return
	}
	ip, ok := localIP(a.boot)
	if !ok || !rdma.Warm(p, ip, a.cfg.rdmaOptions()) {
		return
	}
	a.early = true
	if a.spare != nil {
		if a.earlyEP = a.spare.take(ip, a.budget); a.earlyEP != nil { // spare.go
			return
		}
	}
	a.earlyEP, a.earlyWhy, a.earlyErr = prepareEndpoint(ctx, a.cfg, a.boot, a.budget, nil)
}

// endpoint returns the endpoint prepareEarly made, handing it over, or prepares one:
// see prepareEndpoint.
func (a *acceptState) endpoint(ctx context.Context) (ep *rdma.Endpoint, reason, err error) {
	if !a.early {
		return prepareEndpoint(ctx, a.cfg, a.boot, a.budget, nil)
	}
	ep, reason, err = a.earlyEP, a.earlyWhy, a.earlyErr
	a.early, a.earlyEP = false, nil
	return ep, reason, err
}

// abortEarly releases the endpoint prepareEarly made, if nobody took it.
func (a *acceptState) abortEarly() {
	if a.earlyEP != nil {
		a.earlyEP.Abort()
		a.earlyEP = nil
	}
}

// confirmation is what the client's confirmation byte read brought.
type confirmation struct {
	b   byte
	err error
}

// acceptRDMA answers a client's offer that carries an RDMA endpoint. To upgrade, it
// prepares this side's endpoint (or takes the one prepareEarly made), connects its QP to the client's, sends an accept
// carrying it, answers the client's proof with its own and waits for the client's
// confirmation.
func (a *acceptState) acceptRDMA(ctx context.Context, offer *hello) (upgrade, error) {
	var shm verbs.Provider
	var ep *rdma.Endpoint
	var reason, err error
	if offer.offersSHM() {
		shm, err = a.cfg.sameHostProvider(a.boot)
		switch {
		case err != nil:
			return upgrade{reason: &FallbackError{Err: err}}, nil
		case shm == nil:
			return upgrade{reason: &FallbackError{Err: errSHMDisabled}}, nil
		}
	}
	if shm != nil {
		ep, reason, err = prepareEndpoint(ctx, a.cfg, a.boot, a.budget, shm)
	} else {
		ep, reason, err = a.endpoint(ctx)
	}
	if err != nil {
		return upgrade{}, err
	}
	if reason != nil {
		return upgrade{reason: reason}, nil
	}
	client := offerOf(offer.rdma)
	client.Place = offer.caps&capPlace != 0
	conn, err := ep.Connect(client, a.boot, a.cfg.rdmaKeepAlive())
	if err != nil {
		ep.Abort()
		return upgrade{reason: &FallbackError{Err: connectReason(err)}}, nil
	}
	mine := ep.Offer()
	accept := endpointOf(mine, newNonce())
	// The client's proof is answered where it arrives, on the engine's poller
	// (answerProof), and the confirmation is read here meanwhile: a client that gives
	// up says so at once, and the confirmation that follows our proof wakes this
	// goroutine directly. The read ends with the handshake's deadline at the latest
	// (or when the Listener closes the connection).
	ans := &a.ans
	ans.conn, ans.client, ans.server = conn, offer.rdma.Nonce, accept.Nonce
	ans.ringRKey, ans.ringAddr = mine.RingRKey, mine.RingAddr
	conn.OnProof(&a.ans) // ProofArrived: answer
	ah := acceptHello(accept)
	if shm != nil {
		ah.caps |= capSHM
	}
	if client.Place && mine.Place {
		ah.caps |= capPlace
	}
	if err := writeHello(a.boot, ah); err != nil {
		conn.Abandon()
		return upgrade{}, fmt.Errorf("send hello: %w", err)
	}
	var b [1]byte
	a.spin.init(a.boot, a.cfg.PollSpin) // bootspin.go: the confirmation comes soon
	conn.UseControlSocket(a.spin.raw)   // the socket's handle, made once for both
	_, err = io.ReadFull(&a.spin, b[:])
	c := confirmation{b[0], err}
	// A confirmReady follows our proof, so its answer is recorded by then (or being
	// recorded: outcome waits for it); on anything else the QP is abandoned below,
	// whatever the answer.
	proven, why := ans.outcome()
	switch {
	case c.err != nil:
		conn.Abandon()
		return upgrade{}, fmt.Errorf("read confirmation: %w", c.err)
	case c.b == confirmReady && proven:
		conn.Start()
		return upgrade{data: conn, shm: shm != nil}, nil
	case c.b == confirmReady:
		conn.Abandon()
		if why == nil {
			why = fmt.Errorf("%w: no proof arrived over RDMA", ErrPathUnproven)
		}
		return upgrade{}, fmt.Errorf("%w: the client confirmed an unproven upgrade: %w", ErrBadHello, why)
	case c.b == confirmUnproven:
		conn.Abandon()
		switch {
		case why != nil:
		case proven:
			why = fmt.Errorf("%w: this side's proof did not reach the peer over RDMA: %s", ErrPathUnproven, unprovenHint(shm != nil))
		default:
			why = fmt.Errorf("%w: no RDMA message from the peer before it gave up: %s", ErrPathUnproven, unprovenHint(shm != nil))
		}
		return upgrade{reason: &FallbackError{Err: why}, replied: true}, nil
	case c.b == confirmFailed:
		conn.Abandon()
		return upgrade{reason: &FallbackError{Peer: true, Err: ErrUpgradeFailed}, replied: true}, nil
	}
	conn.Abandon()
	return upgrade{}, fmt.Errorf("%w: confirmation byte %#x", ErrBadHello, c.b)
}

// proofAnswer is the server's answer to the client's proof: answer runs on the
// engine's poller when the proof arrives, outcome on the handshake's goroutine once the
// confirmation is read.
type proofAnswer struct {
	// Set before the proof can arrive: the QP, both hellos' nonces, our ring.
	conn           *rdma.Conn
	client, server nonce
	ringRKey       uint32
	ringAddr       uint64

	mu       sync.Mutex
	decided  bool  // outcome was called: a proof arriving later is not answered
	answered bool  // answer ran
	why      error // why the client's proof did not bind, or was not answered
}

// ProofArrived answers the client's proof: proofAnswer is the engine's
// [rdma.ProofHandler], handed over without a closure around it.
func (p *proofAnswer) ProofArrived() { p.answer() }

// answer checks the client's proof and, if it binds to this connection's hellos
// (nonces client and server), tells the engine the client's ring and sends our proof,
// revealing our ring; if not, it abandons the QP, from a goroutine of its own. It does
// not block: it runs on the engine's poller ([rdma.Conn.OnProof]).
func (p *proofAnswer) answer() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.decided {
		return
	}
	conn := p.conn
	peer, why := serverCheck(conn, p.client, p.server)
	if why == nil {
		// The client writes as soon as it has confirmed, and our engine may answer
		// what arrives (credit, a ring resize) before the confirmation reaches us: it
		// must know the client's ring from now on.
		conn.SetPeerRing(peer.ringAddr, peer.ringRKey)
		ours := proof{role: roleServer, client: p.client, server: p.server, ringRKey: p.ringRKey, ringAddr: p.ringAddr}
		var buf [proofLen]byte // SendProof copies it
		if err := conn.SendProof(ours.appendTo(buf[:0])); err != nil {
			why = fmt.Errorf("%w: send the proof: %w", ErrPathUnproven, err)
		}
	}
	p.answered, p.why = true, why
	if why != nil {
		// Nothing more reaches the QP the proof came over, and the client learns at
		// once. Not on this goroutine: the poller would wait for itself.
		go conn.Abandon()
	}
}

// outcome ends the answer's window and returns whether the client's proof bound and
// ours is on its way, or why not (nil when no proof arrived, and the Conn has not
// failed).
func (p *proofAnswer) outcome() (proven bool, why error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.decided = true
	if p.answered {
		return p.why == nil, p.why
	}
	select {
	case <-p.conn.ProofDone(): // the Conn failed before a proof, which answer is not told of
		_, why = serverCheck(p.conn, p.client, p.server)
	default:
	}
	return false, why
}

// serverCheck reads the client's proof off conn and checks that it binds to the
// connection whose hellos carried the nonces client and server.
func serverCheck(conn *rdma.Conn, client, server nonce) (proof, error) {
	b, err := conn.Proof()
	if err != nil {
		return proof{}, fmt.Errorf("%w: the first RDMA message from the peer failed: %w", ErrPathUnproven, err)
	}
	p, err := decodeProof(b)
	if err == nil {
		err = p.binds(roleClient, client, server)
	}
	return p, err
}

// dialAsBeforeUnitRing makes Dial play a client from before the hello carried the unit
// ring (rdmaEndpoint.UnitRingSize): its offer omits the byte, and it takes no notice of
// the server's. Only tests set it, to check that such a client and a server of today
// agree on every ring's credit unit.
var dialAsBeforeUnitRing bool

// dialAsBeforeWQEGrowth makes Dial play a client from before the hello carried the
// receive queue's growth (rdmaEndpoint.GrowRecvWQEsTo): its offer omits the field, it
// takes no notice of the server's, and its receive queue does not grow. Only tests set
// it, to check that the server then keeps its queue as it started.
var dialAsBeforeWQEGrowth bool

// endpointOf is the hello's form of an engine offer: without the ring's address and key,
// with a nonce.
func endpointOf(o rdma.Offer, n nonce) rdmaEndpoint {
	return rdmaEndpoint{
		GID: o.GID, LID: o.LID, MTU: o.MTU, QPN: o.QPN, PSN: o.PSN,
		RingSize: o.RingSize, RecvWQEs: o.RecvWQEs, MaxInline: o.MaxInline, Nonce: n,
		UnitRingSize: o.UnitRingSize, GrowRecvWQEsTo: o.GrowRecvWQEsTo,
	}
}

// offerOf is the engine offer of a peer's hello endpoint. The ring's address and key
// stay zero: they come with the peer's proof ([rdma.Conn.SetPeerRing]).
func offerOf(e rdmaEndpoint) rdma.Offer {
	return rdma.Offer{
		GID: e.GID, LID: e.LID, MTU: e.MTU, QPN: e.QPN, PSN: e.PSN,
		RingSize: e.RingSize, RecvWQEs: e.RecvWQEs, MaxInline: e.MaxInline,
		UnitRingSize: e.UnitRingSize, GrowRecvWQEsTo: e.GrowRecvWQEsTo,
	}
}

// prepareEndpoint creates this side's RDMA endpoint for boot, or returns why it cannot
// (reason, a *FallbackError). ctx bounds it (the handshake's context: the dial's or the
// Listener's, ending with the handshake timeout); when ctx ends first, the endpoint is
// not prepared and err, matching ctx.Err(), fails the handshake: a device too slow to
// list or open within the handshake timeout is not a reason to overrun it. budget, if
// not nil, is charged for the endpoint's QP and registered memory. p, if not nil, is
// the provider to use instead of the configured one (the same-host provider, shm.go).
func prepareEndpoint(ctx context.Context, cfg *Config, boot bootConn, budget rdma.Budget, p verbs.Provider) (ep *rdma.Endpoint, reason, err error) {
	sameHost := p != nil
	if p == nil {
		if p, err = cfg.provider(); err != nil {
			return nil, &FallbackError{Err: err}, nil
		}
	}
	ip, ok := localIP(boot)
	if !ok {
		return nil, &FallbackError{Err: fmt.Errorf("%w: no local IP address for %v", ErrNoDevice, boot.LocalAddr())}, nil
	}
	opts := cfg.rdmaOptions()
	opts.Budget = budget
	if sameHost {
		large := largeRingFits(budget, opts)
		if large {
			ep, err = rdma.PrepareContext(ctx, p, ip, sameHostOptions(opts))
		}
		if !large || err != nil && ctx.Err() == nil && memoryRefused(err) {
			// The same-host ring would pass half a memory limit, or did not fit one:
			// the ordinary, growing one may, and shared memory with it still beats a
			// fallback to TCP.
			ep, err = rdma.PrepareContext(ctx, p, ip, sameHostSmallOptions(opts))
		}
	} else {
		ep, err = rdma.PrepareContext(ctx, p, ip, opts)
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, nil, fmt.Errorf("prepare rdma endpoint: %w", ctx.Err())
	case err != nil:
		return nil, &FallbackError{Err: prepareReason(p, err)}, nil
	}
	return ep, nil, nil
}

// memoryRefused reports whether err refused an endpoint for the memory it would
// register: a registered-memory budget (the engine's, or a Listener's per-remote or
// per-listener one), RLIMIT_MEMLOCK, or on shared memory RLIMIT_FSIZE, which bounds a
// memfd's size (EFBIG).
func memoryRefused(err error) bool {
	var limit *limitError
	if errors.As(err, &limit) && limit.what == memoryLimit {
		return true
	}
	return errors.Is(err, rdma.ErrMemoryBudget) || errors.Is(err, rdma.ErrMemlock) || errors.Is(err, syscall.EFBIG)
}

// localIP is the address the RDMA device is chosen by: the bootstrap connection's local
// IP. A QUIC socket bound to the wildcard address does not know it; on loopback the
// remote address is the local one.
func localIP(c bootConn) (netip.Addr, bool) {
	ip := addrOf(c.LocalAddr())
	if ip.IsValid() && !ip.IsUnspecified() {
		return ip, true
	}
	if r := addrOf(c.RemoteAddr()); r.IsLoopback() {
		return r, true
	}
	return netip.Addr{}, false
}

// addrOf returns the IP address of a, or the zero Addr.
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) { // the common cases, without formatting and parsing
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// prepareReason turns a failure to prepare an endpoint into a fallback reason.
func prepareReason(p verbs.Provider, err error) error {
	var limit *limitError
	switch {
	case errors.As(err, &limit):
		return fmt.Errorf("%w: %w", ErrResourcesExhausted, limit)
	case errors.Is(err, verbs.ErrNoDevice):
		return fmt.Errorf("%w: provider %s: %w", ErrNoDevice, p.Name(), err)
	case errors.Is(err, rdma.ErrMemoryBudget), errors.Is(err, rdma.ErrMemlock):
		// The engine's text names the limit and the figures.
		return fmt.Errorf("%w: provider %s: %w", ErrResourcesExhausted, p.Name(), err)
	case errors.Is(err, verbs.ErrNoResources), errors.Is(err, rdma.ErrTooManyConns),
		errors.Is(err, rdma.ErrDeviceLimit): // the text names the limit and the figure
		return fmt.Errorf("%w: provider %s: %w", ErrResourcesExhausted, p.Name(), err)
	}
	return fmt.Errorf("%w: provider %s: %w", ErrUpgradeFailed, p.Name(), err)
}

// connectReason turns a failure to connect the QPs into a fallback reason.
func connectReason(err error) error {
	if errors.Is(err, rdma.ErrMTU) {
		return fmt.Errorf("%w: %w", ErrMTUMismatch, err)
	}
	return fmt.Errorf("%w: %w", ErrUpgradeFailed, err)
}

// rdmaOptions are the engine options from a resolved Config.
func (c *Config) rdmaOptions() rdma.Options {
	return rdma.Options{
		RingSize:       c.RingSize,
		GrowRingTo:     c.GrowRingTo,
		SendBufferSize: c.SendBufferSize,
		RecvWQEs:       c.RecvWQEs,
		PollSpin:       c.PollSpin,
		MaxConns:       c.MaxRDMAConns,
		ReadBufferSize: c.ReadBufferSize,
		Linger:         c.Linger,
		TrafficClass:   uint8(c.TrafficClass), // resolve checked the ranges
		ServiceLevel:   uint8(c.ServiceLevel),
		RoCEVersion:    c.RoCEVersion,
		NoPlacement:    c.NoDirectPlacement,

		MaxRegisteredMemory: c.MaxRegisteredMemory,
	}
}

// rdmaKeepAlive is the control-channel keepalive period of RDMA connections.
func (c *Config) rdmaKeepAlive() time.Duration { return max(c.KeepAlive, 0) }

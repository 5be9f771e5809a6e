package rsock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// handshake runs the server's side of the hello on an accepted connection and returns
// the Conn to hand to Accept. It runs in its own goroutine; Listener.Close aborts it by
// closing raw.
func (l *Listener) handshake(raw bootConn, transport string) (*Conn, error) {
	deadline := time.Now().Add(l.cfg.HandshakeTimeout)
	// The hello's reader, the handshake's context and the accept state go together:
	// one allocation for the three.
	a := &acceptState{cfg: l.cfg, boot: raw, transport: transport}
	hr := &a.hr
	if l.cfg.AcceptPlainClients && transport == TransportTCP {
		sniffEnd := time.Now().Add(l.cfg.PlainSniffTimeout)
		if sniffEnd.After(deadline) {
			sniffEnd = deadline
		}
		raw.SetReadDeadline(sniffEnd)
		isHello, err := hr.sniff(raw)
		if testHookSniffed != nil {
			testHookSniffed(isHello)
		}
		if err != nil {
			return nil, fmt.Errorf("read first bytes: %w", err)
		}
		if !isHello {
			raw.SetReadDeadline(time.Time{})
			c := newConn(raw, transport, &FallbackError{Err: ErrPlainClient})
			c.replayPrefix(bytes.Clone(hr.buf[:hr.n]))
			return c, nil
		}
	}
	ctx := &a.hctx // context.WithDeadline's, without a timer unless something waits on it
	ctx.init(l.ctx, deadline)
	defer ctx.release()
	raw.SetDeadline(deadline)
	c, err := l.answer(ctx, a)
	if err != nil {
		return nil, err
	}
	raw.SetDeadline(time.Time{})
	return c, nil
}

// testHookSniffed, when tests set it (before Listen), is told each sniff's verdict.
var testHookSniffed func(isHello bool)

// answer reads the client's offer on a.boot (its first bytes may already be in a.hr) and
// answers it.
func (l *Listener) answer(ctx context.Context, a *acceptState) (*Conn, error) {
	raw, transport, hr := a.boot, a.transport, &a.hr
	a.budget = l.budget.forRemote(raw.RemoteAddr())
	a.spare = &l.spare
	a.prepareEarly(ctx) // upgrade.go: on a warm device, while the offer is on its way
	defer a.abortEarly()
	h, err := hr.read(raw)
	switch {
	case errors.Is(err, ErrVersionMismatch) && h.kind == helloOffer:
		// Another version's offer, framed and skipped: decline in ours, and stay here.
		if err := writeHello(raw, declineHello(declineVersionMismatch)); err != nil {
			return nil, fmt.Errorf("send hello: %w", err)
		}
		return newConn(raw, transport, &FallbackError{Err: err}), nil
	case err != nil:
		return nil, fmt.Errorf("client hello: %w", err)
	case h.kind != helloOffer:
		return nil, fmt.Errorf("client hello: %w: an %v where an offer belongs", ErrBadHello, h.kind)
	}

	var reason error // the decline's, made only for one: an upgrade needs none
	if h.offersRDMA() {
		up, err := a.acceptRDMA(ctx, &h)
		switch {
		case err != nil:
			return nil, fmt.Errorf("upgrade to rdma: %w", err)
		case up.data != nil:
			return newUpgradedConn(raw, up), nil
		case up.replied:
			return newConn(raw, transport, up.reason), nil
		}
		reason = up.reason
	} else {
		reason = &FallbackError{Err: ErrPeerOfferedNone}
	}
	if err := writeHello(raw, declineHello(declineReasonOf(reason))); err != nil {
		return nil, fmt.Errorf("send hello: %w", err)
	}
	return newConn(raw, transport, reason), nil
}

// sniff reads a client's first bytes, up to the length of the hello's magic, and
// reports whether they are the magic. A client that sends something else, sends nothing
// before the read deadline, or closes, is a plain client; the bytes read so far stay in
// hr.buf[:hr.n].
func (hr *helloReader) sniff(r io.Reader) (bool, error) {
	for hr.n < len(helloMagic) {
		m, err := r.Read(hr.buf[hr.n:len(helloMagic)])
		hr.n += m
		if !bytes.Equal(hr.buf[:hr.n], helloMagic[:hr.n]) {
			return false, nil
		}
		if err != nil {
			if err == io.EOF || errors.Is(err, os.ErrDeadlineExceeded) {
				return false, nil
			}
			return false, err
		}
	}
	return true, nil
}

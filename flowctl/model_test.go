package flowctl

import (
	"errors"
	"flag"
	"fmt"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The model tests run two Endpoints against each other the way the stream engine will,
// over a simulated RC connection that is as unforgiving as hardware:
//
//   - A message lands the moment it is posted, the earliest the hardware may deliver it:
//     its bytes are in the peer's ring, so writing over bytes the application has not
//     consumed is caught at once, and it consumes one of the peer's posted receive WQEs,
//     so a message that finds none (RNR) is caught at once too. The peer learns of it,
//     and re-posts the WQE, only when its engine reaps the completion, which may be
//     arbitrarily later. Landing later than this could only hide an RNR, and the
//     Endpoints cannot tell the difference.
//   - Each direction delivers in posting order; the two directions' reaping and the
//     applications' writes and reads interleave arbitrarily.
//
// After every step the invariants hold, and in every state where nothing more can happen
// all data has been read exactly once, in order, and the FINs have arrived: there is no
// deadlock. The exhaustive tests visit every reachable state of small configurations;
// the random tests run larger ones for many steps.

var deep = flag.Bool("flowctl.deep", false, "run longer model explorations")

// mMsg is a message on the simulated wire.
type mMsg struct {
	off, n  int
	imm     uint32
	start   uint64 // data: ring cursor of the first payload byte
	gen     int    // data: which of the receiver's rings it landed in
	mailbox bool   // a resize or an advertisement: its payload went to the receiver's mailbox
	placed  int    // placed bytes: the advertisement (mBuf.id) whose buffer they landed in; else 0
}

// mBuf is a buffer of the application's that its reader advertised for direct
// placement: lent to the peer from the advertisement's hand-out until the Endpoint
// says the peer may no longer place into it (AdvertUsable), and the application's
// again from then on.
type mBuf struct {
	id   int    // which advertisement, counting from 1; 0: none yet
	lent bool   // the peer may write into it
	data []byte // the bytes placed into it, from its start
}

// mAdvMail is an advertisement's payload in the writer's mailbox: what the engine
// writes there (the buffer, which the model names by its id, and the low 32 bits of
// the cursor) until the writer's engine reaps the advertisement and reads it. The
// model gives it a slot of its own, beside the resize's: a reader may hand out an
// advertisement and a resize back to back, and with one slot for both, the search
// finds the resize written over an advertisement the writer has not reaped.
type mAdvMail struct {
	id   int    // 0: empty
	at   uint64 // the whole cursor, which the model knows and the engine does not send
	lo32 uint32
}

// mRing is one receive ring's memory: bytes written by the peer, and which of them hold
// data not yet consumed.
type mRing struct {
	buf []byte
	occ []bool
}

// mSide is one end of the simulated connection: an Endpoint, the ring memory the peer
// writes into, the engine's queues and the application's progress.
type mSide struct {
	ep         Endpoint
	rings      []mRing // own receive rings, written by the peer: the first, then one per resize
	cur        int     // the ring data lands in as this side's Endpoint sees it
	writeGen   int     // the peer's ring this side's engine writes data into
	peerBase   uint64  // stream cursor at which that ring began
	mailbox    uint64  // ring size a resize left in our mailbox, not yet reaped; 0: empty
	resizes    int     // resizes this side's engine may still ask for
	cq         []mMsg  // landed in our ring, completion not reaped (RC keeps them in order)
	toWrite    uint64  // bytes the application has still to write
	written    uint64  // bytes written: the stream cursor
	read       uint64  // bytes the application has read
	close      bool    // the application calls CloseWrite after writing everything
	closed     bool    // CloseWrite was called
	finIn      bool    // the peer's FIN was reaped
	keepalives int     // keepalives the idle timer may still send
	paused     bool    // the application is not reading for now (random runs only)
	idle       bool    // the application is not writing for now (random runs only)
	spill      []byte  // bytes the engine moved out of the ring, unread, oldest first
	spillLimit int     // most bytes spill may hold; zero: the engine never spills
	stopRead   bool    // the application stops reading after readFirst bytes
	readFirst  uint64
	adverts    int      // advertisements this side's reader may still make
	buf        mBuf     // the buffer this side advertised last
	advMail    mAdvMail // the peer's advertisement in our mailbox, not yet reaped
	peerBuf    int      // the id of the peer's buffer our engine may place into (it reaped the advertisement)
	peerBufAt  uint64   // the cursor that advertisement continues
	placedOut  uint64   // stream bytes this side placed into the peer's buffers: written minus the ring cursor
	placedIn   uint64   // stream bytes the application got by placement
	grows      int      // times this side's engine may still add receive WQEs
}

// ringCursor is the cursor of the next byte this side writes into the peer's ring:
// the stream bytes written, less those placed, which never touch the ring.
func (s *mSide) ringCursor() uint64 { return s.written - s.placedOut }

type model struct {
	cfg  *modelConfig
	side [2]mSide
}

// modelConfig is one configuration of the model: side 0 and side 1.
type modelConfig struct {
	name       string
	ring       [2]int    // receive ring size of each side (any power of two)
	wqes       [2]int    // receive WQEs of each side
	unitShift  [2]uint   // ring credit unit of each side's ring, log2
	total      [2]uint64 // bytes each side's application writes
	close      [2]bool   // whether each side closes its write side at the end
	eagerClose bool      // close in the same step as the last write, not at any later time
	keepalives int       // keepalives each side may send
	maxWrite   int       // largest application write (exhaustive runs)
	spill      [2]int    // each side's spill limit (see mSide)
	stopRead   [2]bool   // each side's application stops reading after readFirst bytes
	readFirst  [2]int
	resizes    [2]int // resizes each side's engine may ask for: to half or double its ring
	ringRange  [2]int // smallest and largest ring a resize may name
	adverts    [2]int // advertisements each side's reader may make when it waits for data
	grows      [2]int // times each side's engine may add receive WQEs: one, or doubling them
	growTo     [2]int // the most receive WQEs each side may grow to (Params.GrowWQEsTo)
	// Rules of growing the model tests break on purpose.
	growUnposted bool // side 1's engine owes the peer credit for WQEs it never posted
	peerNoGrow   bool // side 0 takes side 1 for a peer that never grows
	rpc          bool // random runs: writers mostly wait for their reader to advertise
	tweak        func(p *policy)
}

func pattern(side int, cursor uint64) byte {
	return byte(cursor) + byte(cursor>>8)*61 + byte(side)*128
}

func newModel(cfg *modelConfig) *model {
	m := &model{cfg: cfg}
	for i := range 2 {
		s := &m.side[i]
		local := Params{RingSize: cfg.ring[i], RecvWQEs: cfg.wqes[i], GrowWQEsTo: cfg.growTo[i]}
		peer := Params{RingSize: cfg.ring[1-i], RecvWQEs: cfg.wqes[1-i], GrowWQEsTo: cfg.growTo[1-i]}
		if cfg.peerNoGrow && i == 0 {
			peer.GrowWQEsTo = 0
		}
		s.ep = newEndpoint(local, peer)
		s.ep.unitShift = cfg.unitShift[i]
		s.ep.peerUnitShift = cfg.unitShift[1-i]
		s.ep.pol.minRing = 1
		if cfg.tweak != nil {
			cfg.tweak(&s.ep.pol)
		}
		s.rings = []mRing{newRing(cfg.ring[i])}
		s.resizes = cfg.resizes[i]
		s.toWrite = cfg.total[i]
		s.close = cfg.close[i]
		s.keepalives = cfg.keepalives
		s.spillLimit = cfg.spill[i]
		s.stopRead, s.readFirst = cfg.stopRead[i], uint64(cfg.readFirst[i])
		s.adverts = cfg.adverts[i]
		s.grows = cfg.grows[i]
	}
	return m
}

func newRing(size int) mRing { return mRing{buf: make([]byte, size), occ: make([]bool, size)} }

// cloneInto makes dst a copy of m and returns it. The copy's slices reuse the memory of
// dst's, so that a search that keeps one model per depth allocates next to nothing:
// allocating and collecting a clone per step was most of the search's time. dst must
// share no memory with m; a new model does not.
func (m *model) cloneInto(dst *model) *model {
	old := dst.side
	*dst = *m
	for i := range 2 {
		s, o := &dst.side[i], &old[i]
		rings := o.rings[:0]
		for k, r := range s.rings {
			var nr mRing
			if k < cap(rings) {
				nr = rings[:k+1][k] // the ring dst had here: reuse its memory
			}
			nr.buf = append(nr.buf[:0], r.buf...)
			nr.occ = append(nr.occ[:0], r.occ...)
			rings = append(rings, nr)
		}
		s.rings = rings
		s.cq = append(o.cq[:0], s.cq...)
		s.spill = append(o.spill[:0], s.spill...)
		s.buf.data = append(o.buf.data[:0], s.buf.data...)
	}
	return dst
}

type actKind uint8

const (
	actReap      actKind = iota // side's engine reaps the head of its completion queue
	actWrite                    // side's application writes n bytes
	actRead                     // side's application reads n bytes
	actClose                    // side's application calls CloseWrite
	actKeepalive                // side's idle timer sends a keepalive
	actSpill                    // side's engine moves what Spillable says out of the ring
	actResize                   // side's engine registers a ring of n bytes and calls Resize
	actAdvertise                // side's reader, with nothing buffered, advertises its buffer of n bytes
	actCancel                   // side's reader withdraws its advertisement
	actPlace                    // side's application writes n bytes into the peer's advertised buffer
	actDecline                  // side's engine declines the peer's advertisement
	actGrow                     // side's engine posts n more receive WQEs and calls GrowWQEs
)

type action struct {
	kind actKind
	side int
	n    int
}

func (a action) String() string {
	name := [...]string{"reap", "write", "read", "close", "keepalive", "spill", "resize", "advertise", "cancel", "place", "decline", "grow"}[a.kind]
	if a.kind == actWrite || a.kind == actRead || a.kind == actResize || a.kind == actAdvertise || a.kind == actPlace || a.kind == actGrow {
		return fmt.Sprintf("%d:%s(%d)", a.side, name, a.n)
	}
	return fmt.Sprintf("%d:%s", a.side, name)
}

// actions appends the actions enabled in m. A write or a read is listed once, with n
// the most it can do now; callers choose smaller sizes themselves.
func (m *model) actions(acts []action) []action {
	// Applications first, then the engines: the exhaustive search then tries "everyone
	// writes before anyone reaps" early, which is where credit runs out.
	for i := range 2 {
		s := &m.side[i]
		if w := s.ep.Writable(); s.toWrite > 0 && w > 0 && !s.idle {
			acts = append(acts, action{actWrite, i, int(min(s.toWrite, uint64(w)))})
		}
		// The engine chooses between the peer's buffer and the ring: either may come
		// first, and writing to the ring declines the buffer.
		if p := s.ep.Placeable(); s.toWrite > 0 && p > 0 && !s.idle {
			acts = append(acts, action{actPlace, i, int(min(s.toWrite, uint64(p)))})
		}
		// The engine declines in a Write that will not place (one of too few bytes).
		if e := &s.ep; e.peerAdvert != 0 && !e.peerAdvertNew && !e.declineDue && s.toWrite > 0 && !s.idle {
			acts = append(acts, action{actDecline, i, 0})
		}
		if s.close && !s.closed && s.toWrite == 0 && !(m.cfg.eagerClose && s.written > 0) {
			acts = append(acts, action{actClose, i, 0})
		}
		if s.keepalives > 0 && s.ep.credit() > s.ep.pol.reserve {
			acts = append(acts, action{actKeepalive, i, 0})
		}
	}
	for i := range 2 {
		s := &m.side[i]
		b := uint64(s.ep.Buffered() + len(s.spill))
		if s.stopRead {
			b = min(b, s.readFirst-s.read)
		}
		if b > 0 && !s.paused {
			acts = append(acts, action{actRead, i, int(b)})
		}
		if s.ep.Spillable(s.spillLimit-len(s.spill)) > 0 {
			acts = append(acts, action{actSpill, i, 0})
		}
		if len(s.cq) > 0 {
			acts = append(acts, action{actReap, i, 0})
		}
		// A reader waiting in Read with nothing buffered, in the ring or spilled, may
		// advertise its buffer; and withdraw it at any time (a deadline, say).
		if s.adverts > 0 && s.ep.Buffered() == 0 && len(s.spill) == 0 && !s.paused && !s.stopRead &&
			!s.ep.AdvertPending() && !s.ep.PeerClosed() {
			acts = append(acts, action{actAdvertise, i, PlaceUnit})
		}
		if s.ep.AdvertPending() && !s.ep.canceled {
			acts = append(acts, action{actCancel, i, 0})
		}
		if s.resizes > 0 && s.ep.resizeBusy() == nil {
			r := s.ep.RingSize()
			if r/2 >= m.cfg.ringRange[0] {
				acts = append(acts, action{actResize, i, r / 2})
			}
			if r*2 <= m.cfg.ringRange[1] {
				acts = append(acts, action{actResize, i, r * 2})
			}
		}
		if w, most := s.ep.WQEs(), max(m.cfg.growTo[i], m.cfg.wqes[i]); s.grows > 0 && w < most {
			acts = append(acts, action{actGrow, i, 1})
			if d := min(w, most-w); d > 1 {
				acts = append(acts, action{actGrow, i, d})
			}
		}
	}
	return acts
}

// step applies a, then runs the engine's reaction: hand out control messages until
// none is due, and take back an advertised buffer the peer may no longer write.
func (m *model) step(a action) error {
	i := a.side
	s, peer := &m.side[i], &m.side[1-i]
	switch a.kind {
	case actReap:
		msg := s.cq[0]
		s.cq = s.cq[1:]
		arr, err := s.ep.OnArrival(uint32(msg.n), msg.imm)
		if err != nil {
			return fmt.Errorf("side %d: OnArrival(%d, %#x): %w", i, msg.n, msg.imm, err)
		}
		switch arr.Kind {
		case KindData:
			if arr.Off != msg.off || arr.Len != msg.n || s.ep.arrived != msg.start+uint64(msg.n) {
				return fmt.Errorf("side %d: stream bytes [%d, +%d) landed at %d, OnArrival says %d+%d, arrived %d",
					i, msg.start, msg.n, msg.off, arr.Off, arr.Len, s.ep.arrived)
			}
			if msg.gen != s.cur {
				return fmt.Errorf("side %d: stream bytes [%d, +%d) landed in ring %d, OnArrival places them in ring %d", i, msg.start, msg.n, msg.gen, s.cur)
			}
		case KindResize:
			imm, _ := DecodeImm(msg.imm, uint32(msg.n))
			if s.mailbox != 1<<imm.RingLog2 {
				return fmt.Errorf("side %d: mailbox holds %d at a resize to %d", i, s.mailbox, 1<<imm.RingLog2)
			}
			s.mailbox = 0 // the engine reads the new ring's description at the reap
		case KindSwitch:
			s.cur++
			if s.cur != len(s.rings)-1 || s.ep.RingSize() != len(s.rings[s.cur].buf) {
				return fmt.Errorf("side %d: switch to ring %d of %d bytes, it asked for ring %d", i, s.cur, s.ep.RingSize(), len(s.rings)-1)
			}
		case KindFIN:
			if peer.toWrite != 0 || s.ep.arrived != peer.ringCursor() {
				return fmt.Errorf("side %d: FIN arrived after %d bytes, peer wrote %d to the ring and has %d to go", i, s.ep.arrived, peer.ringCursor(), peer.toWrite)
			}
			s.finIn = true
		case KindPlace:
			if err := m.reapPlace(i, msg, arr); err != nil {
				return err
			}
		}
	case actWrite:
		want := min(a.n, s.ep.Writable())
		r, err := s.ep.ReserveData(a.n)
		if err != nil {
			return fmt.Errorf("side %d: ReserveData(%d): %w", i, a.n, err)
		}
		if r.Bytes != want || r.Count == 0 {
			return fmt.Errorf("side %d: ReserveData(%d) = %d bytes in %d messages, Writable said %d", i, a.n, r.Bytes, r.Count, want)
		}
		pr := peer.rings[s.writeGen]
		for _, msg := range r.Msgs[:r.Count] {
			if want := int((s.ringCursor() - s.peerBase) % uint64(len(pr.buf))); msg.Off != want {
				return fmt.Errorf("side %d: data message at ring offset %d, producer cursor is at %d", i, msg.Off, want)
			}
			for k := range msg.Len {
				pos := msg.Off + k
				if pos >= len(pr.buf) {
					return fmt.Errorf("side %d: data message %+v runs past the ring's end", i, msg)
				}
				if pr.occ[pos] {
					return fmt.Errorf("side %d: overwrites unread byte at ring offset %d", i, pos)
				}
				pr.occ[pos] = true
				pr.buf[pos] = pattern(i, s.written+uint64(k))
			}
			if err := m.post(i, mMsg{off: msg.Off, n: msg.Len, imm: msg.Imm, start: s.ringCursor(), gen: s.writeGen}); err != nil {
				return err
			}
			s.written += uint64(msg.Len)
			s.toWrite -= uint64(msg.Len)
		}
		if s.close && s.toWrite == 0 && m.cfg.eagerClose {
			s.ep.CloseWrite()
			s.closed = true
		}
	case actRead:
		// The engine's Read: spilled bytes first, as they are older, then the ring.
		if s.buf.lent {
			return fmt.Errorf("side %d: reads into buffer %d, which the peer may still write", i, s.buf.id)
		}
		n := a.n
		fromSpill := min(n, len(s.spill))
		for _, b := range s.spill[:fromSpill] {
			if want := pattern(1-i, s.read); b != want {
				return fmt.Errorf("side %d: spilled stream byte %d is %#x, want %#x", i, s.read, b, want)
			}
			s.read++
		}
		s.spill = s.spill[fromSpill:]
		n -= fromSpill
		if n > 0 && len(s.spill) > 0 {
			return fmt.Errorf("side %d: reads the ring with %d bytes spilled", i, len(s.spill))
		}
		got, err := s.takeRing(i, n)
		if err != nil {
			return err
		}
		for _, b := range got {
			if want := pattern(1-i, s.read); b != want {
				return fmt.Errorf("side %d: stream byte %d is %#x, want %#x", i, s.read, b, want)
			}
			s.read++
		}
	case actSpill:
		n := s.ep.Spillable(s.spillLimit - len(s.spill))
		if n <= 0 || len(s.spill)+n > s.spillLimit {
			return fmt.Errorf("side %d: Spillable(%d) = %d", i, s.spillLimit-len(s.spill), n)
		}
		got, err := s.takeRing(i, n)
		if err != nil {
			return err
		}
		s.spill = append(s.spill, got...)
	case actClose:
		s.ep.CloseWrite()
		s.closed = true
	case actPlace:
		if err := m.place(i, a.n); err != nil {
			return err
		}
	case actDecline:
		s.ep.declinePlace()
	case actAdvertise:
		l, err := s.ep.Advertise(a.n)
		if err != nil || l != a.n&^(PlaceUnit-1) {
			return fmt.Errorf("side %d: Advertise(%d) = %d, %v", i, a.n, l, err)
		}
		s.adverts--
	case actCancel:
		s.ep.CancelAdvert()
	case actResize:
		if err := s.ep.Resize(a.n); err != nil {
			return fmt.Errorf("side %d: Resize(%d): %w", i, a.n, err)
		}
		s.rings = append(s.rings, newRing(a.n))
		s.resizes--
	case actGrow:
		s.grows--
		if m.cfg.growUnposted && i == 1 {
			s.ep.grown += uint64(a.n) // credit owed for WQEs that are not there
			break
		}
		if err := s.ep.GrowWQEs(a.n); err != nil {
			return fmt.Errorf("side %d: GrowWQEs(%d) on %d: %w", i, a.n, s.ep.WQEs(), err)
		}
	case actKeepalive:
		msg, ok := s.ep.Keepalive()
		if !ok {
			return fmt.Errorf("side %d: Keepalive refused with %d credits", i, s.ep.credit())
		}
		if err := m.post(i, mMsg{imm: msg.Imm}); err != nil {
			return err
		}
		s.keepalives--
	}
	for range 1 << 16 {
		msg, ok := s.ep.NextControl()
		if !ok {
			return s.giveBack(i)
		}
		mm := mMsg{imm: msg.Imm}
		switch {
		case msg.Kind == KindResize && msg.Len == ResizeLen:
			// The engine writes the new ring's description to the peer's mailbox.
			if peer.mailbox != 0 {
				return fmt.Errorf("side %d: resize overwrites the peer's mailbox", i)
			}
			peer.mailbox = uint64(len(s.rings[len(s.rings)-1].buf))
			mm.n, mm.mailbox = ResizeLen, true
		case msg.Kind == KindPlace && msg.Len == AdvertLen:
			// The engine lends the buffer and describes it in the peer's mailbox, with
			// the cursor Advert names.
			l, cursor := s.ep.Advert()
			if imm, err := DecodeImm(msg.Imm, AdvertLen); err != nil || imm.Op != PlaceAdvert || l != int(imm.PlaceUnits)*PlaceUnit {
				return fmt.Errorf("side %d: advertisement %+v (%v) for a buffer of %d bytes", i, imm, err, l)
			}
			if cursor != s.ep.arrived || s.ep.Buffered() != 0 || len(s.spill) != 0 {
				return fmt.Errorf("side %d: advertises at cursor %d with %d bytes arrived, %d buffered and %d spilled", i, cursor, s.ep.arrived, s.ep.Buffered(), len(s.spill))
			}
			if peer.advMail.id != 0 {
				return fmt.Errorf("side %d: advertisement overwrites the peer's mailbox", i)
			}
			s.buf = mBuf{id: s.buf.id + 1, lent: true, data: s.buf.data[:0]}
			peer.advMail = mAdvMail{id: s.buf.id, at: cursor, lo32: uint32(cursor)}
			mm.n, mm.mailbox = AdvertLen, true
		case msg.Len != 0:
			return fmt.Errorf("side %d: control message %+v has a payload", i, msg)
		case msg.Kind == KindSwitch:
			// Data from here on goes to the ring the peer announced, from its start.
			s.writeGen++
			s.peerBase = s.ringCursor()
			if s.writeGen >= len(peer.rings) {
				return fmt.Errorf("side %d: switch to ring %d, the peer has %d", i, s.writeGen, len(peer.rings))
			}
		}
		if err := m.post(i, mm); err != nil {
			return err
		}
	}
	return fmt.Errorf("side %d: NextControl never stops", i)
}

// place has side i's application write n bytes into the peer's advertised buffer,
// where ReservePlace says, as the engine does: the RDMA write lands at once.
func (m *model) place(i, n int) error {
	s, peer := &m.side[i], &m.side[1-i]
	msg, err := s.ep.ReservePlace(n)
	if err != nil {
		return fmt.Errorf("side %d: ReservePlace(%d): %w", i, n, err)
	}
	if imm, err := DecodeImm(msg.Imm, uint32(msg.Len)); err != nil || imm.Op != PlacePlaced || msg.Kind != KindPlace || msg.Len != n || msg.Off != 0 {
		return fmt.Errorf("side %d: ReservePlace(%d) = %+v (%+v, %v)", i, n, msg, imm, err)
	}
	b := &peer.buf
	switch {
	case s.peerBuf == 0 || b.id != s.peerBuf:
		return fmt.Errorf("side %d: places into buffer %d, the peer's last is %d", i, s.peerBuf, b.id)
	case !b.lent:
		return fmt.Errorf("side %d: places into buffer %d, which the peer gave back to its application", i, b.id)
	case len(b.data) != 0:
		return fmt.Errorf("side %d: places into buffer %d a second time", i, b.id)
	}
	for k := range n {
		b.data = append(b.data, pattern(i, s.written+uint64(k)))
	}
	if err := m.post(i, mMsg{n: n, imm: msg.Imm, placed: b.id}); err != nil {
		return err
	}
	s.peerBuf = 0
	s.written += uint64(n)
	s.toWrite -= uint64(n)
	s.placedOut += uint64(n)
	if s.close && s.toWrite == 0 && m.cfg.eagerClose {
		s.ep.CloseWrite()
		s.closed = true
	}
	return nil
}

// reapPlace is side i's engine's part in a placement message it reaped: it reads an
// advertisement out of the mailbox and hands its cursor to PeerAdvert, and hands
// placed bytes, which are in its application's buffer, to the application.
func (m *model) reapPlace(i int, msg mMsg, arr Arrival) error {
	s := &m.side[i]
	switch arr.Op {
	case PlaceAdvert:
		mail := s.advMail
		if mail.id == 0 || !msg.mailbox {
			return fmt.Errorf("side %d: advertisement with nothing in the mailbox", i)
		}
		s.advMail = mAdvMail{}
		if err := s.ep.PeerAdvert(mail.lo32); err != nil {
			return fmt.Errorf("side %d: PeerAdvert(%#x): %w", i, mail.lo32, err)
		}
		s.peerBuf, s.peerBufAt = mail.id, mail.at
	case PlacePlaced:
		b := &s.buf
		if arr.Len != msg.n || msg.placed != b.id || !b.lent || len(b.data) != msg.n {
			return fmt.Errorf("side %d: %d bytes placed into buffer %d (OnArrival says %d), buffer %d holds %d (lent %v)",
				i, msg.n, msg.placed, arr.Len, b.id, len(b.data), b.lent)
		}
		if s.ep.AdvertPending() {
			return fmt.Errorf("side %d: advertisement still pending after its placement", i)
		}
		// The Read that advertised returns them: the next bytes of the stream.
		for _, c := range b.data {
			if want := pattern(1-i, s.read); c != want {
				return fmt.Errorf("side %d: placed stream byte %d is %#x, want %#x", i, s.read, c, want)
			}
			s.read++
		}
		s.placedIn += uint64(len(b.data))
		b.lent, b.data = false, b.data[:0]
	case PlaceDecline, PlaceCancel:
		if arr.Len != 0 || msg.n != 0 {
			return fmt.Errorf("side %d: %v of %d bytes", i, arr.Op, msg.n)
		}
	}
	return nil
}

// giveBack returns an advertised buffer to the application once the Endpoint says
// the peer may no longer place into it. Placed bytes that landed in it and were not
// handed to the application would be lost, or overwritten by the application.
func (s *mSide) giveBack(i int) error {
	if !s.buf.lent || s.ep.AdvertUsable() {
		return nil
	}
	if len(s.buf.data) != 0 {
		return fmt.Errorf("side %d: gives buffer %d back to the application with %d placed bytes not delivered", i, s.buf.id, len(s.buf.data))
	}
	s.buf.lent = false
	return nil
}

// takeRing copies the first n buffered bytes out of side i's rings, where Unread says
// they are, and consumes them, as the engine's Read and spill do: from the old ring
// while OldRing says it holds bytes, then from the current one.
func (s *mSide) takeRing(i, n int) ([]byte, error) {
	var got []byte
	for len(got) < n {
		r := s.rings[s.cur]
		if s.ep.OldRing() {
			if s.cur == 0 {
				return nil, fmt.Errorf("side %d: Unread names an old ring before any switch arrived", i)
			}
			r = s.rings[s.cur-1]
		}
		first, second := s.ep.Unread()
		if first.Len+second.Len == 0 || (!s.ep.OldRing() && first.Len+second.Len != s.ep.Buffered()) {
			return nil, fmt.Errorf("side %d: Unread() = %v, %v for %d bytes buffered", i, first, second, s.ep.Buffered())
		}
		k0 := len(got)
		for _, p := range [2]Piece{first, second} {
			for k := 0; k < p.Len && len(got) < n; k++ {
				pos := p.Off + k
				if !r.occ[pos] {
					return nil, fmt.Errorf("side %d: reads ring offset %d, which holds no data", i, pos)
				}
				got = append(got, r.buf[pos])
				r.occ[pos] = false
			}
		}
		if err := s.ep.Consume(len(got) - k0); err != nil {
			return nil, fmt.Errorf("side %d: Consume(%d): %w", i, len(got)-k0, err)
		}
	}
	return got, nil
}

// post delivers a message from side i to its peer's completion queue.
func (m *model) post(i int, msg mMsg) error {
	peer := &m.side[1-i]
	if len(peer.cq) >= int(peer.ep.wqes) {
		return fmt.Errorf("RNR: message from side %d finds no receive WQE posted at side %d", i, 1-i)
	}
	peer.cq = append(peer.cq, msg)
	return nil
}

// direction names the direction from side i to the other, for error messages.
type direction int

func (d direction) String() string { return fmt.Sprintf("direction %d→%d", int(d), 1-int(d)) }

// check verifies the invariants of both directions.
func (m *model) check() error {
	for i := range 2 {
		sender, rcvr := &m.side[i], &m.side[1-i]
		s, x := &sender.ep, &rcvr.ep
		if s.err != nil || x.err != nil {
			return fmt.Errorf("endpoint failed: %v, %v", s.err, x.err)
		}
		dir := direction(i)
		if s.sent > s.wqeLimit {
			return fmt.Errorf("%s: negative WQE credit: %d sent, limit %d", dir, s.sent, s.wqeLimit)
		}
		if s.peerWQEs > x.wqes {
			return fmt.Errorf("%s: sender counts %d receive WQEs, the receiver posted %d", dir, s.peerWQEs, x.wqes)
		}
		// Messages toward x: landed and not reaped, or reaped.
		inflight := uint64(len(rcvr.cq))
		var data uint64
		for _, msg := range rcvr.cq {
			if !msg.mailbox && msg.placed == 0 {
				data += uint64(msg.n)
			}
		}
		if s.sent != x.reaped+inflight {
			return fmt.Errorf("%s: %d messages sent, %d reaped, %d in flight", dir, s.sent, x.reaped, inflight)
		}
		if s.prod != sender.ringCursor() || s.prod != x.arrived+data {
			return fmt.Errorf("%s: producer cursor %d, written to the ring %d, arrived %d + %d in flight", dir, s.prod, sender.ringCursor(), x.arrived, data)
		}
		if err := checkPlace(dir, sender, rcvr); err != nil {
			return err
		}
		// Credits toward s: carried by messages of x not yet reaped by s.
		var wqeC, ringC uint64
		for _, msg := range sender.cq {
			imm, err := DecodeImm(msg.imm, uint32(msg.n))
			if err != nil {
				return fmt.Errorf("%s: message on the wire does not decode: %w", dir, err)
			}
			wqeC += uint64(imm.WQECredits)
			ringC += uint64(imm.RingCredits) << x.unitShift
		}
		// Every one of x's WQEs is in exactly one place: credit at s, a message on the
		// way or landed, owed by x, or credit on its way back.
		if got := s.credit() + inflight + x.owedWQEs() + wqeC; got != x.wqes {
			return fmt.Errorf("%s: WQE credit leaked or duplicated: %d credit + %d in flight + %d owed + %d returning = %d, want %d",
				dir, s.credit(), inflight, x.owedWQEs(), wqeC, got, x.wqes)
		}
		if x.returned != s.granted+ringC {
			return fmt.Errorf("%s: ring credit leaked: receiver returned up to %d, sender knows %d + %d returning", dir, x.returned, s.granted, ringC)
		}
		if !(x.returned <= x.consumed && x.consumed <= x.arrived && x.returned%(1<<x.unitShift) == 0) {
			return fmt.Errorf("%s: cursors out of order: returned %d, consumed %d, arrived %d", dir, x.returned, x.consumed, x.arrived)
		}
		largest := 0
		for _, r := range rcvr.rings {
			largest = max(largest, len(r.buf))
		}
		if s.prod-s.granted > uint64(largest) {
			return fmt.Errorf("%s: %d bytes outstanding in rings of at most %d", dir, s.prod-s.granted, largest)
		}
		// Spilling is receiver-local: the consumer cursor counts the bytes the
		// application read and the bytes waiting for it in spill, nothing else.
		// Placed bytes are not in the ring: they go to the application past the cursors.
		if rcvr.read+uint64(len(rcvr.spill)) != x.consumed+rcvr.placedIn {
			return fmt.Errorf("%s: application read %d, %d spilled, consumer cursor %d, %d placed", dir, rcvr.read, len(rcvr.spill), x.consumed, rcvr.placedIn)
		}
		if len(rcvr.spill) > rcvr.spillLimit {
			return fmt.Errorf("%s: %d bytes spilled, limit %d", dir, len(rcvr.spill), rcvr.spillLimit)
		}
		occ := 0
		for _, r := range rcvr.rings {
			for _, o := range r.occ {
				if o {
					occ++
				}
			}
		}
		if uint64(occ) != s.prod-x.consumed {
			return fmt.Errorf("%s: %d ring bytes hold data, want %d", dir, occ, s.prod-x.consumed)
		}
	}
	return nil
}

// checkPlace verifies direct placement from sender to rcvr: placed bytes on the wire
// landed in the buffer rcvr lends now, and every advertisement handed out gets exactly
// one answer, held by the sender or on its way, or the FIN.
func checkPlace(dir direction, sender, rcvr *mSide) error {
	s, x := &sender.ep, &rcvr.ep
	var answers, adverts int
	for _, msg := range rcvr.cq { // from the sender: placed bytes and declines
		if imm, _ := DecodeImm(msg.imm, uint32(msg.n)); imm.Kind == KindPlace && (imm.Op == PlacePlaced || imm.Op == PlaceDecline) {
			answers++
		}
		if msg.placed != 0 && (!rcvr.buf.lent || msg.placed != rcvr.buf.id || len(rcvr.buf.data) != msg.n) {
			return fmt.Errorf("%s: %d bytes placed into buffer %d, the receiver lends buffer %d (%v) holding %d",
				dir, msg.n, msg.placed, rcvr.buf.id, rcvr.buf.lent, len(rcvr.buf.data))
		}
	}
	for _, msg := range sender.cq { // from the receiver: advertisements and cancels
		if imm, _ := DecodeImm(msg.imm, uint32(msg.n)); imm.Kind == KindPlace && imm.Op == PlaceAdvert {
			adverts++
		}
	}
	held := 0
	if s.peerAdvert != 0 {
		held = 1
		// A writer past the cursor can never place: it declines at once, not when the
		// reader gives up and cancels.
		if sender.peerBuf != 0 && sender.peerBufAt != sender.ringCursor() && !s.declineDue && !s.finRequested {
			return fmt.Errorf("%s: the sender wrote the ring from %d to %d past buffer %d and has not declined it", dir, sender.peerBufAt, sender.ringCursor(), sender.peerBuf)
		}
	}
	switch n := answers + adverts + held; {
	case n > 1:
		return fmt.Errorf("%s: %d answers on the way, %d advertisements, %d held by the sender", dir, answers, adverts, held)
	case x.advert != 0 && n == 0 && !s.finRequested:
		return fmt.Errorf("%s: an advertisement nobody will answer", dir)
	case x.advert == 0 && answers+held != 0:
		return fmt.Errorf("%s: an answer to no advertisement (%d on the way, %d held)", dir, answers, held)
	case x.advert == 0 && adverts != 0 && !s.finRequested:
		return fmt.Errorf("%s: an advertisement on the way that the receiver no longer counts", dir)
	case rcvr.buf.lent && (x.advert == 0 || !x.AdvertUsable()):
		return fmt.Errorf("%s: buffer %d lent to the sender, the Endpoint has advertised %d (usable %v)", dir, rcvr.buf.id, x.advert, x.AdvertUsable())
	}
	return nil
}

// done reports why m, where nothing can happen any more, is not a finished exchange.
func (m *model) done() error {
	for i := range 2 {
		s, peer := &m.side[i], &m.side[1-i]
		// A resize always completes: the resize and the switch need only the WQE credit
		// that comes back whether or not anyone reads.
		if s.ep.Resizing() || s.ep.switchDue {
			return fmt.Errorf("deadlock: side %d's resize never completed (asked %d, announced %d, switch due %v)", i, s.ep.resizeTo, s.ep.resizing, s.ep.switchDue)
		}
		// Every advertisement is answered, by placed bytes, a decline or the FIN, and
		// its buffer is the application's again.
		if e := &s.ep; e.AdvertPending() || s.buf.lent || e.peerAdvert != 0 || e.declineDue || e.cancelDue || s.advMail.id != 0 {
			return fmt.Errorf("deadlock: an advertisement of side %d's never answered (asked %d, advertised %d, lent %v), or of side %d's (held %d, decline due %v)",
				i, e.advertTo, e.advert, s.buf.lent, 1-i, e.peerAdvert, e.declineDue)
		}
		if peer.stopRead {
			// The peer's application stops reading: the writer gets rid of everything, or
			// of at least what was read, the peer's spill limit and half its ring, and
			// stops only with the spill full.
			switch absorbed := peer.read + uint64(peer.spillLimit+peer.ep.RingSize()/2); {
			case peer.read < min(peer.readFirst, s.written):
				return fmt.Errorf("deadlock: side %d read %d of the first %d bytes", 1-i, peer.read, peer.readFirst)
			case s.toWrite != 0 && (len(peer.spill) < peer.spillLimit || s.written < absorbed):
				return fmt.Errorf("deadlock: side %d stopped after %d bytes toward a side that stopped reading after %d, with %d spilled of %d (want at least %d written)",
					i, s.written, peer.read, len(peer.spill), peer.spillLimit, absorbed)
			case s.toWrite == 0 && s.close && !peer.finIn:
				return fmt.Errorf("deadlock: side %d's FIN never arrived (pending %v, credit %d)", i, s.ep.FINPending(), s.ep.credit())
			case len(s.cq) != 0:
				return fmt.Errorf("messages left in flight at side %d", i)
			}
			continue
		}
		switch {
		case s.toWrite != 0:
			return fmt.Errorf("deadlock: side %d has %d bytes it cannot write (credit %d, free %d)", i, s.toWrite, s.ep.credit(), s.ep.free())
		case peer.read != s.written:
			return fmt.Errorf("deadlock: side %d read %d of %d bytes", 1-i, peer.read, s.written)
		case s.close && !peer.finIn:
			return fmt.Errorf("deadlock: side %d's FIN never arrived (pending %v, credit %d)", i, s.ep.FINPending(), s.ep.credit())
		case len(s.cq) != 0:
			return fmt.Errorf("messages left in flight at side %d", i)
		}
	}
	return nil
}

// key identifies m's state for the exhaustive search: everything that decides what can
// happen next. Statistics are left out, and ring contents follow from the cursors.
func (m *model) key(h *maphash.Hash, b []byte) (uint64, []byte) {
	b = b[:0]
	for i := range 2 {
		s := &m.side[i]
		e := &s.ep
		b = appendKey(b, e.prod, e.granted, e.sent, e.wqeLimit, e.arrived, e.consumed, e.returned, e.reaped, e.wqeReturned,
			s.toWrite, uint64(s.keepalives), uint64(len(s.cq)), uint64(len(s.spill)), s.read,
			e.peerRing, e.peerBase, e.switchTo, e.ring, e.ringBase, e.oldRing, e.switchAt, e.resizeTo, e.resizing,
			uint64(s.resizes), uint64(s.cur), uint64(s.writeGen), s.mailbox, uint64(len(s.rings)),
			e.peerAdvert, e.peerAdvertAt, e.advertTo, e.advert, e.advertAt, uint64(s.adverts),
			uint64(s.buf.id), uint64(len(s.buf.data)), uint64(s.advMail.id), uint64(s.advMail.lo32), uint64(s.peerBuf), s.peerBufAt, s.placedOut, s.placedIn,
			e.wqes, e.grown, e.peerWQEs, uint64(s.grows))
		b = append(b, flags(e.finRequested, e.finSent, e.peerFIN, s.closed, s.finIn, e.switchDue),
			flags(e.peerAdvertNew, e.declineDue, e.advertStale, e.cancelDue, e.canceled, s.buf.lent))
		for _, msg := range s.cq {
			b = appendKey(b, uint64(msg.off), uint64(msg.n), uint64(msg.imm), uint64(msg.placed))
		}
	}
	h.Reset()
	h.Write(b)
	return h.Sum64(), b
}

func appendKey(b []byte, vs ...uint64) []byte {
	for _, v := range vs {
		b = append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32))
	}
	return b
}

func flags(fs ...bool) byte {
	var f byte
	for i, v := range fs {
		if v {
			f |= 1 << i
		}
	}
	return f
}

// exploreResult summarizes an exhaustive search.
type exploreResult struct {
	states    int // distinct states visited
	terminal  int // states where nothing can happen
	maxDepth  int
	ctrlSent  uint64 // most control messages on any path explored
	placed    int    // terminal states some bytes reached by direct placement
	truncated bool
}

// explore visits every state reachable from cfg's start, checking invariants after each
// step and completion in every terminal state. States are told apart by a 64-bit hash
// of everything that decides what can happen next. It fails if a path is longer than
// maxDepth: with finitely much data, only a livelock (say, credit updates answering
// credit updates) makes paths long.
func explore(cfg *modelConfig, maxDepth, maxStates int) (exploreResult, error) {
	var res exploreResult
	seen := make(map[uint64]struct{})
	var h maphash.Hash
	var buf []byte
	var path []action
	// scratch[d] holds the states at depth d while the search is below them: a state's
	// successors are made one at a time, each dead once its subtree is searched.
	var scratch []*model
	trace := func() string {
		var sb strings.Builder
		for _, a := range path {
			sb.WriteString(a.String())
			sb.WriteByte(' ')
		}
		return sb.String()
	}
	var visit func(m *model, depth int) error
	visit = func(m *model, depth int) error {
		var k uint64
		k, buf = m.key(&h, buf)
		if _, ok := seen[k]; ok {
			return nil
		}
		seen[k] = struct{}{}
		res.states++
		res.maxDepth = max(res.maxDepth, depth)
		if res.states > maxStates {
			res.truncated = true
			return nil
		}
		if depth > maxDepth {
			return fmt.Errorf("livelock: a path is longer than %d steps: %s", maxDepth, trace())
		}
		acts := m.actions(nil)
		if len(acts) == 0 {
			res.terminal++
			res.ctrlSent = max(res.ctrlSent, m.side[0].ep.stats.ControlSent+m.side[1].ep.stats.ControlSent)
			if m.side[0].placedOut+m.side[1].placedOut != 0 {
				res.placed++
			}
			if err := m.done(); err != nil {
				return fmt.Errorf("%w\npath: %s", err, trace())
			}
			return nil
		}
		// Every size of every write (up to maxWrite) and read.
		for i := 0; i < len(acts); i++ {
			a := acts[i]
			if (a.kind == actWrite || a.kind == actPlace) && cfg.maxWrite > 0 && a.n > cfg.maxWrite {
				a.n = cfg.maxWrite
			}
			if (a.kind == actWrite || a.kind == actRead || a.kind == actPlace) && a.n > 1 {
				acts = append(acts, action{a.kind, a.side, a.n - 1})
			}
			for len(scratch) <= depth+1 {
				scratch = append(scratch, new(model))
			}
			next := m.cloneInto(scratch[depth+1])
			path = append(path, a)
			if err := next.step(a); err != nil {
				return fmt.Errorf("%w\npath: %s", err, trace())
			}
			if err := next.check(); err != nil {
				return fmt.Errorf("after %v: %w\npath: %s", a, err, trace())
			}
			if err := visit(next, depth+1); err != nil {
				return err
			}
			path = path[:len(path)-1]
		}
		return nil
	}
	err := visit(newModel(cfg), 0)
	return res, err
}

// exhaustiveConfigs are small enough to search completely in seconds, and between them
// exercise wrap-around, writes split at the ring's end, the minimum WQE count, FIN
// waiting for credit, asymmetric sides, multi-byte ring units, credit that does not fit
// one immediate, keepalives, spilling, resizing and direct placement. Paths through them
// run from 30 to 50 steps.
func exhaustiveConfigs() []*modelConfig {
	cfgs := []*modelConfig{
		{name: "both ways, 2-byte rings, FIN right after the last write", ring: [2]int{2, 2}, wqes: [2]int{4, 4},
			total: [2]uint64{3, 3}, close: [2]bool{true, true}, eagerClose: true, maxWrite: 2},
		{name: "both ways, 2-byte rings, CloseWrite at any time after", ring: [2]int{2, 2}, wqes: [2]int{4, 4},
			total: [2]uint64{2, 2}, close: [2]bool{true, true}, maxWrite: 2},
		{name: "both ways, 4-byte rings, writes up to 3 bytes", ring: [2]int{4, 4}, wqes: [2]int{4, 4},
			total: [2]uint64{5, 1}, close: [2]bool{true, true}, eagerClose: true, maxWrite: 3},
		{name: "one way, small immediates, keepalive", ring: [2]int{4, 2}, wqes: [2]int{5, 4},
			total: [2]uint64{0, 5}, close: [2]bool{false, true}, keepalives: 1, maxWrite: 3,
			tweak: func(p *policy) { p.maxWQE, p.maxRing = p.wqeUpdate, 1 }},
		{name: "both ways, 2-byte ring units", ring: [2]int{8, 8}, wqes: [2]int{4, 4}, unitShift: [2]uint{1, 1},
			total: [2]uint64{6, 2}, close: [2]bool{true, false}, maxWrite: 3},
		// Spilling: the engine moves bytes out of the ring when its application is not
		// reading. Toward a side that never reads, the writer gets rid of the spill
		// limit plus at least half a ring; with readers, spilled bytes arrive in order.
		{name: "spill: one way to a side that never reads", ring: [2]int{4, 4}, wqes: [2]int{4, 4},
			total: [2]uint64{12, 0}, spill: [2]int{0, 5}, stopRead: [2]bool{false, true}, maxWrite: 3},
		{name: "spill: one way to a side that reads 3 bytes, then stops", ring: [2]int{8, 8}, wqes: [2]int{4, 4},
			total: [2]uint64{16, 0}, spill: [2]int{0, 3}, stopRead: [2]bool{false, true}, readFirst: [2]int{0, 3}, maxWrite: 3},
		{name: "spill: never read, the spill holds it all, FIN", ring: [2]int{4, 4}, wqes: [2]int{4, 4},
			total: [2]uint64{7, 0}, spill: [2]int{0, 8}, stopRead: [2]bool{false, true}, close: [2]bool{true, false}, maxWrite: 3},
		{name: "spill: both ways while reading", ring: [2]int{4, 4}, wqes: [2]int{4, 4},
			total: [2]uint64{4, 2}, spill: [2]int{2, 3}, close: [2]bool{true, true}, eagerClose: true, maxWrite: 2},
		// Resizing: a receiver replaces its ring by one half or twice its size, at any
		// point of the stream, while the writer's bytes are in flight to the old ring.
		{name: "resize: one way, grow and shrink while streaming", ring: [2]int{4, 4}, wqes: [2]int{4, 4},
			total: [2]uint64{6, 0}, close: [2]bool{true, false}, resizes: [2]int{0, 2}, ringRange: [2]int{2, 8}, maxWrite: 3},
		{name: "resize: both ways, both sides resize", ring: [2]int{2, 2}, wqes: [2]int{4, 4},
			total: [2]uint64{2, 1}, close: [2]bool{true, false}, resizes: [2]int{1, 1}, ringRange: [2]int{2, 4}, maxWrite: 2},
		{name: "resize: toward a side that never reads, spilling", ring: [2]int{4, 4}, wqes: [2]int{4, 4},
			total: [2]uint64{10, 0}, spill: [2]int{0, 4}, stopRead: [2]bool{false, true}, resizes: [2]int{0, 2}, ringRange: [2]int{2, 8}, maxWrite: 3},
		// Direct placement: a reader with nothing buffered advertises its buffer at any
		// point, the writer places into it or writes the ring (or declines), the reader
		// cancels at any point, and the FIN answers what is left.
		{name: "place: one way, two advertisements, no FIN", ring: [2]int{4, 4}, wqes: [2]int{4, 4},
			total: [2]uint64{4, 0}, adverts: [2]int{0, 2}, maxWrite: 2},
		{name: "place: one way, FIN right after the last write", ring: [2]int{2, 2}, wqes: [2]int{4, 4},
			total: [2]uint64{4, 0}, close: [2]bool{true, false}, eagerClose: true, adverts: [2]int{0, 2}, maxWrite: 2},
		{name: "place: both ways, both advertise, CloseWrite at any time", ring: [2]int{2, 2}, wqes: [2]int{4, 4},
			total: [2]uint64{1, 1}, close: [2]bool{true, true}, adverts: [2]int{1, 1}, maxWrite: 1},
		{name: "place: one way, while the ring is resized", ring: [2]int{2, 2}, wqes: [2]int{4, 4},
			total: [2]uint64{3, 0}, close: [2]bool{true, false}, resizes: [2]int{0, 1}, ringRange: [2]int{2, 4}, adverts: [2]int{0, 1}, maxWrite: 2},
		// Growing the receive queue: a receiver adds WQEs, one or doubling them, at any
		// point of the stream; the writer learns of them from the credit.
		{name: "grow: one way, the receiver grows while streaming", ring: [2]int{8, 8}, wqes: [2]int{4, 4},
			total: [2]uint64{7, 0}, close: [2]bool{true, false}, grows: [2]int{0, 2}, growTo: [2]int{0, 9}, maxWrite: 1},
		{name: "grow: both ways, both grow, small immediates", ring: [2]int{2, 2}, wqes: [2]int{4, 4},
			total: [2]uint64{1, 1}, close: [2]bool{true, true}, grows: [2]int{1, 1}, growTo: [2]int{8, 5}, maxWrite: 1,
			tweak: func(p *policy) { p.maxWQE = p.wqeUpdate }},
	}
	if *deep {
		cfgs = append(cfgs,
			&modelConfig{name: "deep: both ways, 4-byte rings, FIN", ring: [2]int{4, 4}, wqes: [2]int{4, 4},
				total: [2]uint64{5, 4}, close: [2]bool{true, true}, maxWrite: 3},
			&modelConfig{name: "deep: both ways, 5 and 4 WQEs, keepalives", ring: [2]int{4, 4}, wqes: [2]int{5, 4},
				total: [2]uint64{4, 3}, keepalives: 1, maxWrite: 4},
			&modelConfig{name: "deep: place both ways, CloseWrite at any time", ring: [2]int{2, 2}, wqes: [2]int{4, 4},
				total: [2]uint64{2, 1}, close: [2]bool{true, true}, adverts: [2]int{1, 1}, maxWrite: 2},
			&modelConfig{name: "deep: asymmetric, small immediates", ring: [2]int{4, 16}, wqes: [2]int{4, 7}, unitShift: [2]uint{0, 2},
				total: [2]uint64{6, 3}, close: [2]bool{true, true}, eagerClose: true, maxWrite: 6,
				tweak: func(p *policy) { p.maxWQE, p.maxRing = p.wqeUpdate, 1 }},
		)
	}
	return cfgs
}

func TestModelExhaustive(t *testing.T) {
	maxStates := 1_000_000
	if *deep {
		maxStates = 15_000_000
	}
	for _, cfg := range exhaustiveConfigs() {
		t.Run(cfg.name, func(t *testing.T) {
			res, err := explore(cfg, 300, maxStates)
			require.NoError(t, err)
			require.False(t, res.truncated, "state space larger than %d states", maxStates)
			require.Positive(t, res.terminal)
			if cfg.adverts != [2]int{} {
				require.Positive(t, res.placed, "no path placed a byte")
			}
			t.Logf("%d states, %d terminal (%d with bytes placed), longest path %d, at most %d control messages",
				res.states, res.terminal, res.placed, res.maxDepth, res.ctrlSent)
		})
	}
}

// TestModelFindsBrokenRules shows the search is strong enough to matter: with a rule of
// the protocol broken, it finds the deadlock or livelock the rule prevents.
func TestModelFindsBrokenRules(t *testing.T) {
	base := modelConfig{ring: [2]int{4, 4}, wqes: [2]int{4, 4}, total: [2]uint64{5, 5}, maxWrite: 1}
	tests := []struct {
		name  string
		tweak func(p *policy)
		want  string
	}{
		// Both sides fill each other's receive queues with data and have no credit
		// left to say they have re-posted the WQEs.
		{"data may take the last WQE credit", func(p *policy) { p.reserve = 0 }, "deadlock"},
		// Each update costs the peer a WQE, which it then owes back at once.
		{"an update for a single WQE", func(p *policy) { p.wqeUpdate = 1 }, "livelock"},
		// Same, when the update may carry back only one of the two credits that made it due.
		{"an update smaller than its trigger", func(p *policy) { p.maxWQE = 1 }, "livelock"},
		// A sender blocked on a full ring is owed exactly one ring.
		{"ring update only past a full ring", func(p *policy) { p.ringUpdate = 2 * 4 }, "deadlock"},
		// A sender blocked on WQEs may be owed only W minus the reserve.
		{"WQE update above W minus the reserve", func(p *policy) { p.wqeUpdate = 3 }, "deadlock"},
		// Toward a side that read a little and stopped, a writer blocked on a ring
		// less than fully buffered may be owed less than the half ring that makes an
		// update due.
		{"spill only from a full ring", func(p *policy) { p.spillAt = 8 }, "deadlock"},
		// The new ring is written from its start: a writer that goes on at its cursor
		// modulo the new size writes where the receiver does not look.
		{"resize: the new ring is written from where the cursor points", func(p *policy) { p.keepBase = true }, "side 0: data message at ring offset"},
		// A ring replaced while the one before still holds bytes: those are lost.
		{"resize: a new ring while the old one still holds bytes", func(p *policy) { p.resizeWhileDraining = true }, "which holds no data"},
		// The receiver that takes the new ring when it announces it, not when the switch
		// arrives, looks for bytes still coming to the old ring, or buffered in it, in
		// the wrong ring.
		{"resize: the receiver switches rings when it announces the new one", func(p *policy) { p.resizeEarly = true }, "Unread names an old ring before any switch arrived"},
		// WQE credit for WQEs never posted: a writer that spends it finds none.
		{"grow: credit for WQEs not posted", nil, "WQE credit leaked or duplicated"},
		// A peer that does not know the receiver grows takes the new WQEs' credit for
		// credit of messages it never sent.
		{"grow: toward a peer that takes no surplus credit", nil, "WQE credits returned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			if strings.HasPrefix(tt.name, "spill") {
				cfg.ring, cfg.total, cfg.maxWrite = [2]int{8, 8}, [2]uint64{16, 0}, 3
				cfg.spill, cfg.stopRead, cfg.readFirst = [2]int{0, 3}, [2]bool{false, true}, [2]int{0, 3}
			}
			if strings.HasPrefix(tt.name, "resize") {
				cfg.total, cfg.maxWrite = [2]uint64{6, 0}, 3
				cfg.resizes, cfg.ringRange = [2]int{0, 2}, [2]int{2, 8}
				if strings.Contains(tt.name, "announces") {
					cfg.resizes[1] = 1
				}
			}
			if strings.HasPrefix(tt.name, "grow") {
				cfg.total, cfg.grows, cfg.growTo = [2]uint64{4, 0}, [2]int{0, 1}, [2]int{0, 8}
				cfg.growUnposted = strings.Contains(tt.name, "not posted")
				cfg.peerNoGrow = strings.Contains(tt.name, "no surplus")
			}
			cfg.name, cfg.tweak = tt.name, tt.tweak
			_, err := explore(&cfg, 200, 1_000_000)
			require.Error(t, err, "the search found nothing wrong")
			require.Contains(t, err.Error(), tt.want)
			t.Log(firstLine(err.Error()))
		})
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// runRandom drives m with random steps: a workload phase in which applications pause
// and resume reading, then a drain in which every enabled step eventually happens. It
// returns the number of steps taken.
func runRandom(m *model, rng *rand.Rand, steps int) (int, error) {
	var acts []action
	n := 0
	pick := func(pauses bool) (bool, error) {
		if pauses && rng.IntN(50) == 0 {
			s := &m.side[rng.IntN(2)]
			s.paused = !s.paused
		}
		if pauses && rng.IntN(50) == 0 {
			// A writer that pauses lets its reader catch up and wait, advertising.
			s := &m.side[rng.IntN(2)]
			s.idle = !s.idle
		}
		acts = m.actions(acts[:0])
		if len(acts) == 0 {
			return false, nil
		}
		a, ok := m.towardPlacement(rng, acts, acts[rng.IntN(len(acts))], pauses)
		if !ok {
			return true, nil
		}
		if (a.kind == actWrite || a.kind == actRead || a.kind == actPlace) && rng.IntN(3) != 0 {
			// Often whole writes and read-everything readers, else any size.
			a.n = 1 + rng.IntN(a.n)
		}
		if a.kind == actAdvertise {
			// Buffers of one to four units, asked for in lengths Advertise rounds down.
			a.n = PlaceUnit*(1+rng.IntN(4)) + rng.IntN(PlaceUnit)
		}
		n++
		if err := m.step(a); err != nil {
			return false, err
		}
		if err := m.check(); err != nil {
			return false, fmt.Errorf("after %v: %w", a, err)
		}
		return true, nil
	}
	for range steps {
		if ok, err := pick(true); err != nil || !ok {
			if err == nil {
				// Stuck while an application is paused is expected; resume and go on.
				if m.side[0].paused || m.side[1].paused || m.side[0].idle || m.side[1].idle {
					for i := range 2 {
						m.side[i].paused, m.side[i].idle = false, false
					}
					continue
				}
				return n, m.done()
			}
			return n, err
		}
	}
	for i := range 2 {
		m.side[i].paused, m.side[i].idle = false, false
	}
	limit := n + 1_000_000
	for n < limit {
		ok, err := pick(false)
		if err != nil {
			return n, err
		}
		if !ok {
			return n, m.done()
		}
	}
	return n, errors.New("livelock: the drain never ends")
}

// towardPlacement steers a random run toward direct placement, which needs a reader
// waiting with nothing buffered and a writer with bytes to write when the
// advertisement reaches it. Of the actions acts, a was drawn; towardPlacement mostly
// draws again for a cancel or a decline (an idle writer resumes instead of its reader
// canceling) and for an advertisement toward a writer with nothing left to write, and
// half the time has a writer that may place do so rather than write the ring. In the
// workload phase of rpc runs, it mostly holds writers back, reporting false for no
// step, until their reader advertises, as a server answers a client that waits.
func (m *model) towardPlacement(rng *rand.Rand, acts []action, a action, workload bool) (action, bool) {
	for (a.kind == actCancel || a.kind == actDecline) && rng.IntN(32) != 0 {
		if peer := &m.side[1-a.side]; a.kind == actCancel && peer.idle {
			peer.idle = false
			return a, false
		}
		a = acts[rng.IntN(len(acts))]
	}
	if a.kind == actAdvertise && m.side[1-a.side].toWrite == 0 && rng.IntN(8) != 0 {
		a = acts[rng.IntN(len(acts))]
	}
	if a.kind == actWrite && rng.IntN(2) == 0 {
		for _, b := range acts {
			if b.kind == actPlace && b.side == a.side {
				a = b
			}
		}
	}
	if w, r := &m.side[a.side], &m.side[1-a.side]; workload && m.cfg.rpc && a.kind == actWrite &&
		w.ep.peerAdvert == 0 && r.adverts > 0 && !r.stopRead && rng.IntN(8) != 0 {
		return a, false
	}
	return a, true
}

// randomConfig draws a configuration: tiny rings that wrap constantly, rings as small as
// the engine's, WQE counts from the minimum up, ring units above a byte, immediates too
// small for the owed credit, rings resized at random times, and readers that advertise
// their buffers for direct placement, of one to four PlaceUnits.
func randomConfig(rng *rand.Rand) *modelConfig {
	cfg := &modelConfig{name: "random", keepalives: rng.IntN(4)}
	for i := range 2 {
		cfg.ring[i] = 1 << (2 + rng.IntN(11)) // 4 B to 4 KiB
		cfg.wqes[i] = MinRecvWQEs + rng.IntN(20)
		if rng.IntN(3) == 0 {
			// At least two units to a ring, as every ring has within the Params'
			// limits (TestRingHoldsTwoUnits): a reader that stopped one byte short of
			// a unit then still lets the writer fill half the ring, which done expects.
			cfg.unitShift[i] = uint(rng.IntN(min(3, bits.Len(uint(cfg.ring[i]))-1)))
		}
		cfg.total[i] = uint64(rng.IntN(1 + 8*cfg.ring[i]))
		cfg.close[i] = rng.IntN(2) == 0
		if rng.IntN(2) == 0 {
			cfg.spill[i] = rng.IntN(1 + 4*cfg.ring[i])
		}
	}
	if rng.IntN(6) == 0 {
		i := rng.IntN(2) // a side that stops reading
		cfg.stopRead[i], cfg.readFirst[i] = true, rng.IntN(1+2*cfg.ring[i])
	}
	if rng.IntN(4) == 0 {
		cfg.total[rng.IntN(2)] = 0 // one way
	}
	if cfg.unitShift == [2]uint{} && rng.IntN(2) == 0 {
		// Rings that grow and shrink: resizes may change the ring unit, so only where
		// the unit stays a byte.
		cfg.ringRange = [2]int{2, 8 << 10}
		for i := range 2 {
			cfg.resizes[i] = rng.IntN(6)
		}
	}
	if rng.IntN(3) != 0 {
		// Readers that advertise their buffers when they wait for data, and writers
		// that, like a server's, mostly write when their reader waits.
		for i := range 2 {
			cfg.adverts[i] = rng.IntN(40)
		}
		cfg.rpc = rng.IntN(2) == 0
	}
	if rng.IntN(3) == 0 {
		// Receive queues that grow, by one WQE or doubling, at random times.
		for i := range 2 {
			cfg.growTo[i] = cfg.wqes[i] + rng.IntN(40)
			cfg.grows[i] = rng.IntN(5)
		}
	}
	if rng.IntN(3) == 0 {
		// Immediates that hold little: owed credit is carried over several messages. An
		// update must still return the WQE credit that made it due, or updates would
		// answer updates forever (see TestModelFindsBrokenRules).
		extra, maxRing := uint64(rng.IntN(3)), uint64(1+rng.IntN(5))
		cfg.tweak = func(p *policy) { p.maxWQE, p.maxRing = p.wqeUpdate+extra, maxRing }
	}
	return cfg
}

func TestModelRandom(t *testing.T) {
	runs, steps := 250, 3000
	if *deep {
		runs, steps = 5000, 20000
	}
	total, switches, placed, grown := 0, 0, uint64(0), uint64(0)
	for run := range runs {
		seed := uint64(run)
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		cfg := randomConfig(rng)
		m := newModel(cfg)
		n, err := runRandom(m, rng, steps)
		require.NoError(t, err, "seed %d, config %+v", seed, *cfg)
		total += n
		switches += m.side[0].cur + m.side[1].cur
		placed += m.side[0].ep.stats.PlacedSent + m.side[1].ep.stats.PlacedSent
		grown += m.side[0].ep.grown + m.side[1].ep.grown
	}
	t.Logf("%d runs, %d steps, %d rings switched, %d placements, %d WQEs added", runs, total, switches, placed, grown)
	require.Positive(t, grown, "no run grew a receive queue")
	require.Positive(t, switches, "no run resized a ring")
	require.Positive(t, placed, "no run placed bytes")
}

// TestModelCreditRatio runs a steady one-way stream and bounds the credit-only messages
// it costs. The receiver sends a standalone update after every wqeUpdate messages or
// ringUpdate consumed bytes, whichever comes first, so per data message there are at
// most 1/wqeUpdate + size/ringUpdate updates. The sender never needs one: its data
// carries the credit for the updates.
func TestModelCreditRatio(t *testing.T) {
	tests := []struct {
		ring, wqes, size int
	}{
		{MinRingSize, 64, 64},
		{MinRingSize, 64, 512},
		{MinRingSize, 64, 4096},
		{128 << 10, 256, 64},
		{128 << 10, 256, 1024},
		{128 << 10, 256, 16 << 10},
	}
	for _, tt := range tests {
		cfg := &modelConfig{name: "ratio", ring: [2]int{tt.ring, tt.ring}, wqes: [2]int{tt.wqes, tt.wqes}}
		m := newModel(cfg)
		rng := rand.New(rand.NewPCG(uint64(tt.size), uint64(tt.ring)))
		// Stream 16 rings' worth of writes of tt.size bytes, with landing, reaping and
		// reading interleaved at random.
		m.side[0].toWrite = uint64(16 * tt.ring)
		var acts []action
		for {
			acts = m.actions(acts[:0])
			if len(acts) == 0 {
				break
			}
			a := acts[rng.IntN(len(acts))]
			switch a.kind {
			case actWrite:
				a.n = min(a.n, tt.size)
			}
			require.NoError(t, m.step(a))
		}
		require.NoError(t, m.done())
		rx, tx := m.side[1].ep.stats, m.side[0].ep.stats
		data := tx.DataSent
		updates := rx.ControlSent + tx.ControlSent
		x := &m.side[1].ep
		bound := float64(data)/float64(x.pol.wqeUpdate) + float64(m.side[0].written)/float64(x.pol.ringUpdate) + 1
		ratio := float64(updates) / float64(data)
		t.Logf("ring %d, %d WQEs, writes of %d: %d data messages, %d credit-only (%d from the sender): ratio %.4f, bound %.4f",
			tt.ring, tt.wqes, tt.size, data, updates, tx.ControlSent, ratio, bound/float64(data))
		if float64(updates) > bound {
			t.Errorf("ring %d, %d WQEs, writes of %d: %d credit-only messages for %d data messages, want at most %.1f", tt.ring, tt.wqes, tt.size, updates, data, bound)
		}
	}
}

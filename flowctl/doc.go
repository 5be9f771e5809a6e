// Package flowctl is the flow control of rsock's RDMA data path: the credit and
// ring-cursor protocol that keeps a sender from writing over bytes its peer has not read
// and from sending a message its peer has no receive WQE for. It is logic only, with no
// I/O, goroutines, verbs or clocks: the stream engine in rsock calls an [Endpoint] under
// its connection lock, and the model tests call two of them over a simulated connection.
//
// # The data path
//
// Each side registers a receive ring and pre-posts receive WQEs, and tells the peer how
// many of each in the connection hello ([Params]). To send, a side writes the next bytes
// of its stream into the peer's ring with RDMA_WRITE_WITH_IMM, at its producer cursor
// modulo the ring size; a write that crosses the ring's end goes as two messages. Every
// message, data or not, consumes one receive WQE at the peer and produces one receive
// completion there, whose byte length is the payload length and whose 32-bit immediate
// ([Imm]) tells the kind of message and carries credit back. Zero-length messages carry
// credit updates, the FIN and keepalives.
//
// The hardware checks neither of the two things that can go wrong. A write into ring
// space whose bytes the application has not read overwrites them silently; a message
// that finds no receive WQE posted is RNR, which stalls the queue pair for milliseconds
// or breaks it. So a sender spends two kinds of credit, and sends only while it has both:
//
//   - Ring bytes. Cursors are 64-bit byte counts that only grow; positions are cursors
//     modulo the ring size, a power of two. The sender keeps its producer cursor and the
//     consumer cursor the receiver last returned, and writes only below that consumer
//     cursor plus the ring size. The receiver keeps what has arrived, what the
//     application has consumed and what it has returned.
//   - Receive WQEs. The sender counts the messages it has sent against the WQEs the peer
//     pre-posted plus every WQE credit returned since.
//
// # Returning credit
//
// The receiving engine re-posts a WQE for every completion it reaps, whether or not the
// application reads, so WQE credit never waits for Read. Ring credit is the bytes the
// application has consumed. Both ride back in the immediate of every message going the
// other way, data or not: up to [MaxImmWQECredits] WQEs and [MaxImmRingCredits] ring
// units (one byte for rings up to 512 KiB; see [RingUnit]). What does not fit stays owed
// and goes with the next message, so no credit is ever lost. When no traffic flows the
// other way, a side sends a standalone credit update, a zero-length message, once it owes
// half its WQEs (at most 511) or half its ring.
//
// The peer need not announce that it is blocked. A sender out of ring space is owed a
// whole ring once the application has read, and a sender out of data credit is owed at
// least half the WQEs; either crosses a threshold, so the update goes out without being
// asked for.
//
// # Why it cannot deadlock
//
// Credit updates need WQE credit too, so two sides that have both spent all their
// credit could each wait forever for the other's update. Two rules prevent it:
//
//  1. Data never takes the peer's last [ReservedCredits] WQE credits. Credit updates and
//     the FIN may.
//  2. The very last WQE credit goes only to a message that returns WQE credit.
//
// Suppose the connection is stuck: nothing in flight, both applications willing to
// read everything that arrives, and some side wanting to send. With nothing in flight,
// a side's WQE credit is its peer's WQE count minus what the peer owes it. A side
// blocked on ring space is owed a whole ring, and a side blocked on data credit holds at
// most the reserve, so its peer owes it at least half its WQEs: either way the peer has
// an update due. A side that cannot send a due update or FIN has no credit at all, or
// exactly one and nothing to return; in the second case its peer owes it all but one
// WQE, and holds all of its own credit, and sends. So being stuck means both sides have
// no credit. But look at the last message sent before: if it left its sender a credit,
// that side has one; if it took its sender's last credit, rule 2 made it carry WQE credit
// to the other side, which has sent nothing since and so has a credit. Neither can be.
// (A reserve of two also suffices without rule 2, by a longer argument; rule 2 makes the
// short one hold and costs at most a wait for credit that is already on its way.)
//
// Updates cannot answer each other forever either. A side sends a standalone update
// for new consumption, or once it owes at least two WQEs (half of at least
// [MinRecvWQEs]), and then it returns at least as many as made it due; each update
// costs the peer only one WQE. So every update the peer sends back needs at least two
// from this side, and an exchange of updates with no data behind it dies out.
//
// The model tests check all of this by search: every interleaving of writes, reads and
// completions in small configurations, and long random runs in larger ones, with the
// invariants (no overwrite, no RNR, no credit created or lost, every byte delivered once
// and in order, no deadlock, no livelock) checked after every step. Without the reserve,
// or with a threshold past the bound the argument needs, they find the deadlock or
// livelock that follows. For a steady one-way stream the receiver sends one update per
// min(W/2, 511) messages or per half ring of bytes, whichever comes first; the sender
// sends none, because its data carries the credit back.
//
// # Spilling
//
// A ring holds only what the peer may write before the application reads, and programs
// written for TCP count on more: they write a whole request before the peer has
// accepted or reads, and expect a kernel's worth of buffering. So when its application
// is not reading, the engine moves buffered bytes out of the ring into memory of its
// own (unpinned, growing up to a limit) and calls Consume for them: [Endpoint.Spillable]
// says how many, which is everything buffered, up to the room left, once the peer holds
// no ring credit ([Endpoint.PeerRingCredit] is zero: it may be blocked) and half the
// ring or more is buffered. The application later reads the spilled bytes before those
// still in the ring, which are newer. A spill is a copy the application's read would
// not need, so it waits until a writer may be blocked: while the peer holds ring credit
// it is not blocked on ring space, and its next arrival asks again. (Spilling from half
// a ring, whatever the peer held, copied a tenth to half of a stream's bytes once more
// on a 4 MiB ring, its reader reading all the while.)
//
// Spilling is local to the receiver, and the credit protocol does not change: no new
// message, no new rule, nothing the peer can see but credit arriving sooner. To the
// Endpoint a spill is a read, and everything above holds for any reader, whenever and
// however much it reads. What spilling adds is progress toward an application that does
// not read. A writer blocked on ring space, with everything it sent arrived, has its
// peer's ring full: the bytes buffered plus the bytes consumed and not yet returned make
// a whole ring. If at least half is buffered, the engine spills it (while there is room);
// if less, at least half a ring is consumed and owed, which makes an update due. Either
// way the writer is freed, until the spill is full: a writer toward an application that
// stopped reading gets rid of at least what was read, the spill limit and half a ring
// before it blocks. Spilling from a higher threshold would break this: a reader that
// reads a little and stops could leave the ring, say, five eighths buffered and three
// eighths owed, with neither a spill nor an update due.
//
// The engine asks Spillable after every data arrival and after every read ends, while
// no read is in progress; those are the only events that can make it non-zero (credit
// runs out only at an arrival), so a spill that is due always happens. At the end of a
// read, when [Endpoint.PeerRingCredit] is zero, the engine first gives back what the
// reads consumed with [Endpoint.CreditNow], an update sent early, once that is an eighth
// of the ring or [CreditNowMin]; the peer's next arrival then asks again. Only when less
// is owed (or no WQE credit is to spare) does the end of the read spill. The model tests
// check it with receivers that never read and receivers that read a little and stop:
// the writer gets as far as the rule says, and spilled bytes reach the application
// exactly once and in order.
//
// # Resizing the ring
//
// A ring is pinned memory, and most connections are idle most of the time: a ring sized
// for a busy stream wastes its memory on an idle one, and one sized for an idle one
// throttles a busy stream. So a receiver may replace its ring, by one twice or half the
// size or any other power of two of the same credit unit (up to 512 KiB, when rings
// start below it, or up to the size the side fixed its unit by, [Params].UnitRingSize),
// while the stream runs. Two messages do it:
//
//   - The receiver registers the new ring, calls [Endpoint.Resize], and sends a resize
//     (kind 5): its immediate names the new size (log2, in the ring-credit field), and
//     its [ResizeLen]-byte payload, which the engine defines (the new ring's address and
//     key), goes to the peer's mailbox, a small region the engine keeps beside its
//     ring. Only one resize is under way at a time, so the mailbox never holds two.
//   - The sender answers with a switch (kind 6), zero bytes: every data byte it wrote
//     before the switch went to the old ring, every byte after goes to the new one,
//     from its start. It writes nothing between the resize's arrival and its switch.
//
// Because a connection delivers in order, the switch splits the stream at one cursor
// both sides agree on: the receiver places data that arrives after it in the new ring,
// and reads the bytes still in the old ring first, then frees it ([Endpoint.OldRing]).
// No byte moves, so none is lost, duplicated or reordered.
//
// Nothing else changes. Cursors are byte counts of the stream, not ring positions, so
// ring credit means what it meant: the sender writes only below the consumer cursor
// plus the size of the ring it writes to. That rule alone keeps the new ring from being
// overwritten: a byte at cursor c goes where the byte at c minus the ring size went,
// which was consumed; bytes below the switch are in the old ring and never collide.
// After a shrink the sender may have more outstanding than the new size; it then writes
// nothing until credit brings it below. The receiver checks arrivals against the ring
// the sender is writing to, and scales its update and spill thresholds to it, at the
// switch, not before: until the switch arrives, the sender still writes the old one.
//
// The resize and the switch spend WQE credit as data does, never the reserve, so the
// deadlock argument above covers them unchanged: a side that has one due and no data
// credit is owed at least half the peer's WQEs, and the peer sends the update that lets
// it go. The resize carries WQE credit back like any message (its ring credit waits for
// the next one). A resize therefore always completes, whether or not anyone reads, and
// a writer that wants to write never waits on one for longer than it would wait for
// credit.
//
// The model tests resize rings, to half or twice their size, at every point of small
// exchanges and at random in long ones, with the invariants above plus: data lands in
// the ring the receiver places it in, the mailbox is never overwritten, and every
// resize completes. Broken on purpose, the rules are caught: a sender that writes the
// new ring from where its cursor points instead of its start, a receiver that takes the
// new ring when it announces it instead of at the switch, and one that resizes again
// while the old ring still holds bytes.
//
// When to resize is the engine's policy, not the protocol's: it can grow a ring a
// stream keeps full and shrink it when the connection idles.
//
// # Growing the receive queue
//
// Every message takes a receive WQE, whatever its length, so a stream of small messages
// runs out of WQE credit long before it fills the ring: with W WQEs it has at most W
// messages in flight, and the rest of the ring waits. WQEs are cheap to hold but not
// free (each reserves a completion-queue entry), so a receiver may start with few and
// add more while such a stream runs. Unlike a ring, a posted WQE cannot be taken back:
// the queue only grows, to a bound each side names in its hello ([Params].GrowWQEsTo).
//
// Growing needs no message. The receiver posts n more WQEs and calls
// [Endpoint.GrowWQEs]; from then on it owes the peer n more WQE credits, exactly as if
// it had re-posted n WQEs for n messages, and the next message returns them in its
// immediate. The peer, which would reject credit for messages it never sent
// ([ErrCreditOverflow]), takes credit beyond its outstanding messages as WQEs added,
// as long as the total stays within the receiver's GrowWQEsTo. Which credit it counts
// as which does not matter: its WQE limit, the peer's WQEs plus all the credit
// returned, is exact either way, and an honest receiver's credit beyond the messages
// outstanding never exceeds what it grew.
//
// Nothing else changes. The arguments above hold with the larger count: every WQE the
// receiver holds is posted before its credit can leave, so no message finds none; the
// update threshold scales with the count and stays at most half of it, so a writer out
// of WQE credit is still owed an update; and a growth adds a bounded number of owed
// credits, so the updates it makes due die out like any others. A peer that did not
// name a GrowWQEsTo (from before growth existed) takes no surplus, and a receiver facing
// it does not grow: the engine knows from its hello.
//
// The model tests grow either side's queue, by one WQE or doubling it, at every point of
// small exchanges and at random in long ones, with the invariants above plus: the
// writer never counts more WQEs than the receiver posted. Broken on purpose, the rules
// are caught: a receiver that owes credit for WQEs it did not post (the credit then
// outnumbers the WQEs), and a peer that takes no credit beyond its messages.
//
// When to grow is the engine's policy: when a one-way stream makes a standalone update
// due by WQE count while most of the ring is free, WQEs, not bytes, bound it.
//
// # Direct placement
//
// A receiver copies every byte out of its ring into the application's buffer. For a
// large Read that copy can be skipped: the receiver advertises the Read's buffer, and
// the sender writes the next bytes of the stream straight into it. Four operations of
// one kind (KindPlace, the operation in the immediate) do it:
//
//   - An advertisement, from the receiver, with nothing buffered: the buffer's length
//     (in PlaceUnits) in the immediate, and an [AdvertLen]-byte payload the engine
//     defines (where the buffer is, its key, and the low half of the stream cursor the
//     buffer continues: the bytes arrived so far) to the sender's mailbox.
//   - Placed bytes, from the sender: an RDMA_WRITE_WITH_IMM of up to the buffer's
//     length into the buffer, from its start.
//   - A decline, from the sender: the advertisement will not be used.
//   - A cancel, from the receiver: answer now.
//
// The rules:
//
//  1. The sender places only while its producer cursor equals the advertised cursor:
//     everything it wrote to the ring has arrived, and nothing is in flight. Placed
//     bytes then follow every ring byte the receiver holds, and the receiver, having
//     nothing buffered when it advertised, returns them next. Placed bytes move no
//     cursor and take no ring credit: the ring is not touched, so the credit units and
//     everything above about ring credit stand unchanged.
//  2. Every advertisement gets exactly one answer, in the sender's order: placed bytes,
//     a decline, or the sender's FIN. A sender that writes to the ring while an
//     advertisement is unanswered declines it (its cursor has moved past it), and so
//     does a sender that receives one whose cursor it has already written past; a
//     cancel is answered with a decline unless the answer is already on its way. The
//     receiver advertises again only after the answer, so the mailbox holds one
//     advertisement at a time, read at its arrival.
//  3. Data or the FIN arriving while an advertisement is unanswered proves the sender
//     will not place into it (rule 1: its cursor moved past, or it closed): the buffer
//     is the application's again at once ([Endpoint.AdvertUsable]), though the answer
//     is still to come. Placed bytes after that are a protocol violation.
//
// Nothing is lost or duplicated: a byte goes either to the ring, at its cursor, or into
// the one usable buffer, at the cursor the buffer continues; the receiver, which had
// nothing buffered when it advertised, returns placed bytes before ring bytes that
// arrive after them, which is the order they were written in, since the connection
// delivers in order. No placement lands in a buffer the receiver no longer expects it
// in: a buffer stops being usable only by an answer, or by data or the FIN (rule 3),
// which come after any placement into it, or when the receiver's connection fails and
// its queue pair accepts nothing more. The advertisement has a mailbox slot of its
// own, apart from the resize's: the two may be under way at once. Every placement operation spends WQE credit as data does, never
// the reserve, like the resize and the switch, so the credit argument above covers them.
// They carry WQE credit back; their ring-credit field holds the operation, so owed ring
// credit waits for the next message.
//
// The model tests run placement with the rest: advertisements at every point a
// receiver may make them, placements and ring writes racing them, cancels, and FINs,
// with the invariants above plus: placed bytes land only in a usable buffer, and
// every advertisement is answered.
//
// # A misbehaving peer
//
// Nothing the peer sends is trusted. [Endpoint.OnArrival] rejects an immediate that does
// not decode or does not match its byte length ([ErrMalformed]), data beyond the ring
// space granted ([ErrRingOverrun]), more messages than WQEs granted ([ErrWQEOverrun]),
// credit for bytes or messages never sent, beyond the WQEs it may add ([ErrCreditOverflow]) and data or a second FIN
// after the FIN ([ErrAfterFIN]), a resize or switch out of turn or to a ring out of
// range ([ErrBadResize]), and a placement out of turn ([ErrBadPlace]). The error is sticky; the engine closes the connection.
//
// # Usage
//
// The engine creates one [Endpoint] per connection with [NewEndpoint], and calls it with
// its connection mutex held. Every message the Endpoint hands out must be posted, in the
// order handed out, before any later one; so the engine checks that its send queue has
// room for two work requests before asking for a message.
//
// On Write(p): call [Endpoint.ReserveData] with as much of p as the staging buffer takes
// (a quarter of the peer's ring or less keeps the pipe full and the updates few). Copy
// the first Bytes of p to staging and post Msgs[0] and then Msgs[1], each as an
// RDMA_WRITE_WITH_IMM of Len bytes to the peer's ring base plus Off, with immediate Imm.
// Continue with the rest of p. When nothing is reserved (Count 0), wait for an arrival
// that reports Credited, then try again. A zero-length p reserves nothing and sends
// nothing.
//
// On a successful receive completion: re-post a receive WQE first, then pass the
// completion's byte length and immediate to [Endpoint.OnArrival]. An error is a
// protocol violation: close the connection with it. Wake readers on data or FIN, and
// writers when Credited.
//
// On Read(p): [Endpoint.Unread] names the buffered bytes in the ring, in up to two
// pieces; copy out up to len(p) and [Endpoint.Consume] that many. When nothing is
// buffered, return io.EOF if [Endpoint.PeerClosed], else wait for data. When the
// application is not reading, after an arrival and at the end of every read, spill
// what [Endpoint.Spillable] hands out (see "Spilling").
//
// To grow the receive queue (see "Growing the receive queue"): post the new receive WQEs,
// call [Endpoint.GrowWQEs], then NextControl.
//
// After each of these, and after [Endpoint.CloseWrite]: post what [Endpoint.NextControl]
// hands out until it returns false. That sends the FIN once credit allows, and the
// standalone credit updates exactly when due. Nothing else need be tracked: the
// immediates are built by the Endpoint, with the credit owed in them.
//
// To resize (see "Resizing the ring"): register the new ring, call [Endpoint.Resize] and
// then NextControl, which hands out a message of Kind KindResize: post it as a write of
// the new ring's description to the peer's mailbox. On the arrival of a resize, read the
// description from the mailbox before anything else, and keep it: when NextControl
// hands out the switch (KindSwitch), post it, and write data to the new ring from then
// on. On the arrival of a switch, data pieces name the new ring; Unread names the old
// one while [Endpoint.OldRing] reports true, and the old ring may be freed once it
// reports false.
//
// On a send completion: nothing here; it frees staging space and send-queue slots.
//
// On the idle timer: post what [Endpoint.Keepalive] hands out, if anything. It only uses
// credit data could use, and carries credit like any message. When it hands out nothing,
// the peer owes this side credit and will send soon.
package flowctl

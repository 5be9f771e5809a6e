// Package shm is a verbs provider for two processes on one host: a [verbs.Provider]
// whose reliable-connected (RC) queue pairs connect QPs of different processes (or of
// one) through shared memory, with the RC rules of verbs/soft, so that everything above
// package verbs runs unchanged between them with no RDMA device.
//
// # Usage
//
//	p, err := shm.New(shm.Options{})
//	defer p.Close()
//	ctx, err := p.Open("shm0")
//
// From there the verbs API is used as with any provider. A device's port has a RoCE v2
// GID for each IP address of the host (127.0.0.1 first), so a connection finds it by
// its local address as it would a RoCE NIC. Each QP takes a number no other QP of the
// network namespace has, by binding the abstract Unix socket that number names
// (@rsock-shm-qp-<qpn>); a QP connects, in its RTR transition, to QP DestQPN, in this
// process or another, and its requests find that QP's process by the number alone. The
// responder takes them only from the GID and QPN its own RTR transition named, so a QP
// of another host that happens to have the number here is never reached: its peer sees
// a dead link.
//
// # How it works
//
// Memory regions are memfds, mapped shared and sealed against shrinking; a region of
// the caller's own memory (PD.RegLocalMemory, verbs.LocalMemoryRegistrar) is no memfd,
// and serves only as a local buffer of this process's work requests, which copy out of
// and into it themselves: no peer can map it, so it grants no remote access. A
// requester QP connects to its destination QP's socket (SOCK_SEQPACKET) and passes,
// with its hello, a channel: a memfd holding a request ring and a response ring, their
// cursors and a "sleeping" word for each consumer (channel.go). It places its work
// requests in the request ring, numbered by PSN, many ahead of their answers
// (pipelined), and the responder answers each, in order, in the response ring:
//
//   - RDMA WRITE (with or without immediate): the first request naming an rkey asks the
//     responder for that region; the responder passes the memfd (SCM_RIGHTS, on the
//     socket) if the key names a region of the responder QP's PD that grants a remote
//     access, and read-only when it grants remote read only. The requester maps it and
//     copies each payload straight into it as it places the request, which the
//     responder checks (QP state and peer, access flags, rkey, bounds, a receive WQE for
//     the immediate) and completes in its CQ before it answers: ACK, RNR NAK, error, or
//     drop (lost).
//   - RDMA READ: the same region query; the responder checks and acknowledges, and the
//     requester copies out of its mapping.
//   - SEND: the payload travels in the request record (at most 64 KiB) and the responder
//     scatters it into its receive WQE's buffers.
//
// An RNR NAK or a loss makes the requester abandon the requests behind the refused one
// (the responder drops them as out of sequence) and resend from it, go-back-N. A
// request the requester's own copy of the region refuses is sent alone, nothing behind
// it until its answer, so that no later payload lands in a region whose QP the refusal
// moves to ERROR.
//
// Polling a CQ drains the rings that feed it before it reaps (drive.go): the request
// rings of its QPs' incoming connections and the response rings of their outgoing ones,
// so a busy-polling application moves requests and completions itself, with no
// wake-up and no system call; an empty poll looks again for a couple of microseconds
// (pollwait.go), then yields the processor (sched_yield) to the peer process that
// should fill it. A poll passes by a ring with nothing published after reading its two
// cursors, without taking its lock, so the idle connections on a CQ cost a busy one
// little. A goroutine per connection end covers the rest and
// sleeps in the netpoller on the socket: it says so in the channel first, and the peer
// that publishes a record for a sleeping consumer rings its doorbell, a one-byte
// datagram; while the CQ a ring feeds is being polled, and not armed, its goroutine
// leaves the ring to the polls and does not say it sleeps, so nothing rings. Arming a
// CQ says so for every ring that feeds it. Responses wake a sleeping requester only
// when it asked (a signaled WR, a READ, a pipeline filling up) or when they are not
// plain acknowledgements; a requester whose next WR must wait for the answers in flight
// (a region query, a fence) watches its response ring a moment, then sleeps with a
// deadline (1 ms, doubling to 64 ms) until they come.
//
// In shared memory are payload bytes, the channel's records and its cursors, nothing
// else: a peer that scribbles over a region it was given can change only the bytes of
// that region, and one that scribbles over a channel can only break that connection.
// Every cursor and record length read from a channel is checked against the ring and
// the bytes published, records are copied out before they are decoded, and each side
// keeps its own cursors in private memory; a violation ends the connection, which the
// requester sees as a dead link. A Poll or an arming never blocks writing to a peer's
// socket (doorbells are dropped when it is full): the answer to a region query, a
// datagram whose write blocks while the requester leaves its socket unread, is sent by
// that connection's goroutine alone, so a requester that floods queries and reads
// nothing stalls its own connection only (TestUnreadRegionAnswers); and a drain takes a
// bounded batch of records under the ring's lock, so a peer that keeps its ring full
// holds up no arming of the CQ beyond one batch (TestDrainBatches). Peers must run as
// the same user (SO_PEERCRED, checked in both directions) unless [Options].AllowUIDs
// says otherwise.
//
// # Rules enforced
//
// Those of verbs/soft (see its package documentation): the QP state machine, queue
// capacities with slots released when completions are polled, RNR retries per rnr_retry
// and the responder's RNR timer, remote access checks with REM_ACCESS_ERR and both QPs to
// ERROR, length and protection errors of receive WQEs, per-QP order of execution and
// completion (the payload of an RDMA write is in place before its receive completion),
// unsignaled WRs, CQ overflow, flushes in ERROR, and lost requests (destination gone,
// reset, in ERROR, not connected back) retransmitted after the ACK timeout RetryCount
// times, then RETRY_EXC_ERR. The conformance suite verbs/verbstest runs against it with
// both ends in one process and with each end in its own.
//
// # Peer death
//
// A peer process that dies closes its sockets. Its requests stop; requests to it are
// lost and end in RETRY_EXC_ERR after the retry budget (at once when the ACK timeout is
// 0, which on hardware would wait forever), and the QP moves to ERROR. Regions it mapped
// from this process stay mapped in no one but this process.
//
// # Out of file descriptors
//
// A QP's connection to its peer is a Unix socket, and the regions and channels it
// passes are memfds, so a process out of descriptors (EMFILE) cannot connect, and its
// requests are lost as to an unreachable peer, ending in RETRY_EXC_ERR: the QP's
// TransportCause ([verbs.TransportCauser]) returns the error behind that. A QP whose
// accept of a peer's connection fails keeps accepting after a pause (5 ms, doubling to
// 1 s), so the peer's retransmissions are answered once descriptors are free.
//
// # Memory mappings
//
// Every mapping (a region's memory, a channel at either end, a peer's region) counts
// against rsock's share of the process's vm.max_map_count (internal/vma), past which
// the Go runtime's own mmap would be refused. A QP reserves those its connections make
// (mapquota.go), so CreateQP is refused, not a connection already up, and keeps at
// most one of its peer's regions mapped: a WR naming another asks for it anew, and the
// one it replaces is unmapped, with the memory the peer had already let go of.
//
// # Deviations from hardware
//
//   - A region the owner deregistered stays writable to a requester that mapped it,
//     until that requester maps another region of the same peer or reconnects; on
//     hardware the rkey fails at once.
//   - The payload of an RDMA WRITE lands when the requester places the request, which
//     may be before the responder executes the requests ahead of it: a request that an
//     RNR NAK or a loss ahead of it sends again writes the same bytes twice, and one
//     behind a request that fails at the responder (but passed the requester's own
//     checks) can land in a region whose QP then goes to ERROR.
//   - An answer that outlasts the ACK timeout (a loaded machine) makes the requester
//     retransmit over a new connection; the PSN keeps the responder from executing the
//     request twice.
//   - SEND payloads are limited to 64 KiB; a longer SEND completes with LOC_LEN_ERR.
//   - Inline data must lie in memory registered on the same device, as with soft.
//   - A requester that kept a region mapped copies into it on its own check of the
//     region's rights, and the responder's check decides the completion: a responder QP
//     reset and connected anew to the same requester with fewer rights in between can
//     see a refused write's bytes land. The requester forgets its mappings whenever a
//     request is dropped or refused.
//   - MaxRdAtomic and MaxDestRdAtomic are accepted but not enforced.
//
// # Fault injection
//
// [Provider.BreakQP], [Provider.DelayQP], [Provider.FailQP], [Provider.FailAllocs] and
// [Provider.SetPortState] inject faults on this process's side, as verbs/soft's do (they
// implement verbstest.Faults and verbstest.PortFaults).
package shm

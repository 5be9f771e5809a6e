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
// Memory regions are memfds, mapped shared and sealed against shrinking. A requester QP
// connects to its destination QP's socket (SOCK_SEQPACKET) and sends its work requests
// one at a time, numbered by PSN, each answered by the responder:
//
//   - RDMA WRITE (with or without immediate): the first request naming an rkey asks the
//     responder for that region; the responder passes the memfd (SCM_RIGHTS) if
//     the key names a region of the responder QP's PD that grants a remote access, and
//     read-only when it grants remote read only. The requester maps it, copies the
//     payload straight into it, then sends the request, which the responder checks (QP
//     state and peer, access flags, rkey, bounds, a receive WQE for the immediate) and
//     completes in its CQ before it answers: ACK, RNR NAK, error, or drop (lost).
//   - RDMA READ: the same region query; the responder checks and acknowledges, and the
//     requester copies out of its mapping.
//   - SEND: the payload travels in the request datagram (at most 64 KiB) and the
//     responder scatters it into its receive WQE's buffers.
//
// Nothing in shared memory but payload bytes: no queue, index or completion lives there,
// so a peer that scribbles over a region it was given can change only the bytes of that
// region, never this process's control state. Every datagram is decoded with bounds
// checks; one that breaks the protocol ends the connection, which the requester sees as a
// dead link. Peers must run as the same user (SO_PEERCRED, checked in both directions)
// unless [Options].AllowUIDs says otherwise.
//
// Each connection has a goroutine on each side that parks in the netpoller while nothing
// arrives: the datagram is the doorbell, and no thread sleeps in a system call.
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
// # Deviations from hardware
//
//   - Requests are executed one at a time per QP (stop-and-wait), not pipelined: each
//     work request costs a round trip of datagrams and two goroutine wake-ups, which
//     bounds throughput and latency well below a Unix socket's today.
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

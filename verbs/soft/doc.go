// Package soft is a software RDMA provider: a [verbs.Provider] whose devices live in one
// process and whose reliable-connected (RC) queue pairs move bytes by copying between
// registered Go buffers. It exists so that every layer above package verbs can be tested
// on machines without an RDMA device, and it is worth exactly as much as its fidelity: it
// behaves as an RC QP on real hardware does, including where that is inconvenient.
//
// # Usage
//
//	fab := soft.New(soft.Options{Devices: 2, TimeScale: 0.01})
//	ctx, err := fab.Open("soft0")
//
// From there the verbs API is used as with any provider. QPs are addressed as real ones
// are: a QP connects, in its RTR transition, to the QP number DestQPN on the device whose
// GID is Dest.DestGID, both exchanged out of band. Device i (named soft<i>) has two RoCE v2
// GIDs: a link-local fe80:: GID (index 0) and the IPv4-mapped address 127.0.0.(i+1)
// (index 1), on netdev "lo". QPs on the same device or on different devices of one
// [Fabric] connect; QPs of different fabrics never see each other.
//
// [Options].Ports gives a device another port ([PortConfig]): a GID table with holes
// (entries at their hardware indices), several addresses, netdevs, an InfiniBand link
// layer, a state. The source GID is the entry SGIDIndex names by hardware index: an
// empty index fails ToRTR, and requests sent from a GID other than the one the
// responder connected to are dropped, as a kernel device drops them.
//
// # Rules enforced
//
//   - The QP state machine: RESET → INIT → RTR → RTS, ERROR from any state but RESET,
//     RESET from any state. Other transitions (RESET → ERROR among them, which the kernel
//     refuses too) fail with [verbs.ErrInvalidState] and change nothing.
//     PostSend needs RTS; PostRecv needs INIT or later. In ERROR both accept work requests
//     and flush them at once.
//   - Posting past MaxSendWR or MaxRecvWR outstanding WRs fails at once with a
//     [*verbs.PostError] wrapping [verbs.ErrQueueFull], as ENOMEM does. A slot is
//     outstanding from its post until the completion that retires it is polled, as with
//     drivers that advance the queue tail while polling.
//   - A SEND, SEND_WITH_IMM or RDMA_WRITE_WITH_IMM that finds no receive WQE gets an RNR
//     NAK. The requester retries after the responder's MinRNRTimer, RNRRetry times (7:
//     forever), then completes it with RNR_RETRY_EXC_ERR and moves to ERROR. Posting a
//     receive does not cut the RNR timer short.
//   - Remote accesses check the responder QP's access flags, then the rkey: it must name a
//     region of the responder QP's PD that grants the access and holds every byte. A
//     violation completes with REM_ACCESS_ERR and moves both QPs to ERROR. A zero-length
//     RDMA WRITE or READ checks no rkey, as the InfiniBand specification says.
//   - A SEND longer than the receive WQE's buffers completes the receive with LOC_LEN_ERR
//     and the send with REM_INV_REQ_ERR; a receive buffer that is not writable memory of
//     the responder's PD completes it with LOC_PROT_ERR and the send with REM_OP_ERR. Both
//     QPs go to ERROR. A local SGE that names no region of the QP's PD, or strays outside
//     it, completes with LOC_PROT_ERR.
//   - Each QP executes and completes its WRs in order; a WR waiting for an RNR retry, a
//     retransmission or an injected delay holds back every WR behind it. The payload of an
//     RDMA write (with or without immediate) is in the target region before the receive
//     completion is added to the CQ, so it is visible to whoever polls it.
//   - Unsignaled WRs (without SendSignaled on a QP without SignalAll) produce no completion
//     when they succeed; their slots are released by the next completion of the same
//     send queue. A WR that completes in error always produces a completion.
//   - A CQ holds exactly the number of entries it was created with. A completion that finds
//     it full is lost; Poll then fails with [verbs.ErrCQOverflow] for good and the QPs that
//     add completions to it move to ERROR.
//   - In ERROR every outstanding WR, signaled or not, completes with WR_FLUSH_ERR in order:
//     at once after ToError, shortly after an asynchronous error. Unsignaled WRs that had
//     already executed produce nothing; their slots are released by the next completion.
//   - Requests are lost, as on a dead link, when the destination GID or QPN names no live
//     QP, when the destination is not in RTR or RTS, is not connected back to the sender,
//     or expects another PSN (PSNs advance per packet of PathMTU bytes, so mismatched PSNs
//     or MTUs also break a connection). The requester retransmits after its ACK timeout,
//     RetryCount times, then completes with RETRY_EXC_ERR and moves to ERROR. Timeout 0
//     waits forever and never retransmits.
//   - Inline payloads (SendInline) are copied at post time; more than MaxInlineData bytes
//     fail the post with [verbs.ErrInvalidArgument].
//
// # Timers
//
// A lost request is retransmitted after the local ACK timeout, 4.096 µs × 2^Timeout, so a
// dead link costs a requester (RetryCount+1) × 4.096 µs × 2^Timeout before RETRY_EXC_ERR.
// After an RNR NAK the requester waits the responder's MinRNRTimer, decoded with the table
// of ibv_modify_qp(3) (1 is 0.01 ms, 14 is 1.28 ms, 0 is 655.36 ms). [Options].TimeScale
// multiplies both, so tests can keep hardware-like settings and still run fast.
//
// # Fault injection
//
// [Fabric.BreakQP], [Fabric.BreakLink] and their Repair counterparts lose requests;
// [Fabric.SetPath] makes the path between two GIDs unreachable or lossy (a filtered
// RoCE port, a route to elsewhere), while the QPs on it still reach RTS; [QP.Query]
// reports the address vector a QP was connected with; [Fabric.DelayQP] and [Fabric.DelayLink] delay them; [Fabric.FailQP] and
// [Fabric.FailDevice] move QPs to ERROR as a fatal asynchronous event would;
// [Fabric.FailAllocs] makes the next allocations of one kind fail with
// [verbs.ErrNoResources].
//
// Asynchronous events ([verbs.Context.WaitAsyncEvent]) reach every context open on a
// device: [Fabric.FailQP] raises EventQPFatal, [Fabric.FailDevice] EventDeviceFatal,
// [Fabric.SetPortState] EventPortErr or EventPortActive (a port that is not active
// loses every request to and from its device, and leaves QPs alone, as rxe does when
// its netdev goes down), and [Fabric.RaisePortEvent] any other port event, such as
// EventGIDChange. [Fabric.LeaveDestroyedCompletions] and [Fabric.ReuseQPNs] make a
// destroyed QP behave as on rxe: its unpolled completions stay in its CQs, and its
// number goes to the next QP. [Fabric.Stats] reports live resource counts (so tests can check
// that they return to where they started) and counters such as RNR NAKs and retries.
//
// # Deviations from hardware
//
//   - Inline data must lie in memory registered on the same device (any PD): Go gives soft
//     no safe way to read arbitrary addresses. Other inline sends fail to post with
//     [verbs.ErrInvalidArgument].
//   - MR addresses are synthetic (see [MR]); MR memory is an ordinary Go slice.
//   - MaxRdAtomic and MaxDestRdAtomic are accepted but not enforced: RDMA READs are served
//     as soon as they arrive.
//   - A request is delivered whole or not at all; a link that breaks mid-message loses
//     the whole message.
//   - Asynchronous events are not reported; their effect on QP state is.
//
// # Performance and concurrency
//
// Nothing runs in the background. A WR with nothing queued ahead of it and no injected
// delay is executed inside PostSend: the payload is copied into the responder's region,
// the receive completion (if any) is added to the responder's CQ, then the sender's
// completion (if signaled). Posting and polling allocate nothing. A WR that must wait is
// queued and driven by the QP's [time.Timer], whose callback runs on its own goroutine;
// nothing exists while nothing waits, so closing every QP leaves no goroutine behind.
//
// There is no global lock on the data path. Locks are taken in this order, never in
// reverse and never two of one rank: a requester QP's send-queue mutex, then a receive-
// queue mutex (the responder's, or the QP's own when flushing), then a CQ's mutex, then
// its completion channel's mutex. The mutexes of a device's QP map, of the link fault
// table, of the key tables and of reference counts are leaves: nothing is locked while
// holding them. Keys are looked up without locks. A fatal error found while holding
// another QP's locks sets that QP's state atomically and resets its timer, whose callback
// flushes its queues under their own locks; whoever next holds a queue's lock and sees
// ERROR flushes what is left in it first, so flushes keep their order.
package soft

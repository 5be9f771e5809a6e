// Package verbs is the Go interface to the RDMA verbs model, independent of any provider.
//
// It mirrors the shape of libibverbs (ibv_*): a [Provider] lists devices and opens a
// [Context]; a context allocates protection domains ([PD]), completion channels
// ([CompChannel]) and completion queues ([CQ]); a protection domain registers memory
// ([MR]) and creates reliable-connected queue pairs ([QP]). Work requests ([SendWR],
// [RecvWR]) and completions ([WorkCompletion]) are plain structs that callers own, so
// posting and polling allocate nothing.
//
// Two providers implement this package: verbs/soft, a software RC fabric inside one
// process with hardware-faithful semantics and fault injection, and verbs/ibv, rdma-core
// through cgo (build tag rdma). The conformance suite in verbs/verbstest states the rules
// both must obey.
//
// # Connecting a queue pair
//
// An RC QP is created in [QPStateReset], then moved through [QP.ToInit], [QP.ToRTR] (with
// the peer's QPN, PSN, address and path MTU, exchanged out of band) and [QP.ToRTS]. Only
// an RTS QP may post sends; receives may be posted from INIT on. Any fatal error moves
// the QP to [QPStateError], after which every outstanding work request completes with
// [WCWRFlushErr].
//
// # Completions
//
// [CQ.Poll] copies up to len(wc) completions into a caller-owned slice. To sleep instead
// of spinning, arm the CQ with [CQ.ReqNotify], poll once more (a completion may have
// arrived in between), then call [CompChannel.Wait], which blocks the goroutine, never an
// OS thread, until an armed CQ on that channel receives a completion. [Context.CreateCQ]
// names a completion vector, below [DeviceAttr].NumCompVectors: CQs spread over the
// vectors spread their interrupts over CPUs.
//
// # Asynchronous events
//
// [Context.WaitAsyncEvent] returns the device's asynchronous events ([AsyncEvent]),
// already acknowledged: a port going down or up, a GID or LID change, a fatal device,
// QP and CQ errors. Each context queues its own from the moment it is opened; a
// program that never asks loses nothing but the oldest events beyond
// [MaxQueuedAsyncEvents].
package verbs

// Package rc holds the reliable-connected (RC) rules that the pure-Go providers
// (verbs/soft in one process, verbs/shm between processes) share, so that each states
// them once and keeps only its transport: how a request and its response travel.
//
// What lives here is what is the same in both providers:
//
//   - [CQ] and [Channel]: a completion queue of fixed capacity that overflows, releases
//     work-queue slots when its completions are polled (not when they are generated), and
//     raises one coalesced event on its channel when armed.
//   - [Refs]: the reference counts that make destroying a PD, CQ, channel or context still
//     in use fail with [verbs.ErrBusy], as EBUSY does.
//   - [RecvQueue]: the posted receive WQEs, their SGL copies and the slots in use.
//   - The argument checks of ibv_create_cq, ibv_create_qp, the ibv_modify_qp transitions
//     and post_send/post_recv, the move to ERROR and a fatal error's state change
//     (checks.go).
//   - [Region]: a registered region's bounds, the local SGL and receive scatter
//     resolution with their protection and length errors, and the responder's remote
//     access check, over a provider's key table ([KeyTable]) (mr.go, keys.go).
//   - The RNR NAK and ACK timeout encodings (timers.go).
//
// What stays in each provider is its transport: how a request reaches the responder and
// its response the requester (soft: a call between QPs of one process; shm: rings in
// shared memory between processes), and with it the send queue's pipelining and retries.
//
// The core names the provider it serves in its errors ([Provider]), so that an error
// still says "soft: poll CQ: ..." or "shm: poll CQ: ...".
//
// Nothing here starts a goroutine or allocates on the work-request path: [CQ.Poll] and
// [CQ.Push] take one mutex and touch no interface; a key lookup ([KeyTable.Lookup]) takes
// no lock and inlines.
package rc

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
//   - The argument checks of ibv_reg_mr, ibv_create_cq, ibv_create_qp and the
//     ibv_modify_qp transitions (checks.go), and the bounds check of a region (mr.go).
//
// The core names the provider it serves in its errors ([Provider]), so that an error
// still says "soft: poll CQ: ..." or "shm: poll CQ: ...".
//
// Nothing here starts a goroutine or allocates on the completion path: [CQ.Poll] and
// [CQ.Push] take one mutex and touch no interface.
package rc

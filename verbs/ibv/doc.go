// Package ibv is the rdma-core provider of package verbs: real RDMA devices through
// libibverbs, over cgo against <infiniband/verbs.h> (Debian's libibverbs-dev).
//
// The provider is compiled only with the build tag rdma, on Linux, with cgo. Without
// them the package builds to a stub whose [Open] returns [ErrNotBuilt] ("ibv: not built
// with RDMA support (build with -tags rdma)"), and go build ./... needs no C
// toolchain. The sysfs reading ([ReadGIDTable], and the transports and netdevs that
// Devices reports) is pure Go and present in every build.
//
// # Usage
//
//	p, err := ibv.Open() // or auto.Default(), which also checks for an active port
//	if err != nil {
//		// errors.Is(err, verbs.ErrNotSupported): not built in, or no libibverbs
//		// errors.Is(err, verbs.ErrNoDevice): no device
//	}
//	devs, err := p.Devices()
//	sel, err := verbs.SelectPort(devs, localIP) // device, port, GID (hardware index)
//	ctx, err := p.Open(sel.Device.Name)
//
// # Loading libibverbs
//
// The binary does not link libibverbs: cgo links only -ldl. The first [Open] dlopens
// libibverbs.so.1 and resolves each function it calls with dlvsym at the symbol
// version verbs.h compiles against (IBVERBS_1.1; IBVERBS_1.0 for the completion
// channel functions, which have no other), falling back to dlsym for a library without
// symbol versions. A binary built with the tag therefore starts on a machine without
// libibverbs; Open then returns a *[LibraryError] ("ibv: dlopen libibverbs.so.1: ..."),
// which matches verbs.ErrNotSupported, and every later Open returns it too; one that
// failed for want of file descriptors or memory is Temporary, matches
// verbs.ErrNoResources instead, and the next Open tries again. With the library but no
// device (or no kernel RDMA support) Open returns an error matching verbs.ErrNoDevice.
// The library stays loaded for the life of the process.
//
// The fast-path calls ibv_post_send, ibv_post_recv, ibv_poll_cq and ibv_req_notify_cq
// are static inline functions in verbs.h that dispatch through the context's ops
// table; they run inside small C helpers (shim.h), one cgo call per post or poll batch.
// ibv_query_port and ibv_reg_mr are macros in verbs.h that reference versioned
// symbols; the helpers call the dlsym'ed functions instead (for ibv_query_port, the
// extended context's query_port op first, as the macro does).
//
// # Memory
//
// Work requests, scatter/gather lists and completion arrays live in C memory,
// allocated once per QP (64 requests per post call, each with the QP's granted
// number of SGEs; longer slices are posted in batches) and once per CQ (64
// completions per ibv_poll_cq call). Posting and polling copy between these and the
// caller's slices and allocate nothing. Memory regions are anonymous private mmap
// (golang.org/x/sys/unix) marked MADV_DONTFORK, never the Go heap; MR.Bytes is that
// mapping, and Close deregisters and unmaps it. No Go pointer is given to C to keep:
// qp_context and cq_context are NULL, and C objects are matched to Go objects by
// address in per-context registries. ibv_fork_init is not called: Go starts child
// processes with vfork semantics, and the MR memory is excluded from fork anyway.
//
// # Completions and events
//
// A completion channel's fd, and the context's async event fd, are set O_NONBLOCK
// and a duplicate of each is handed to Go's netpoller (os.NewFile; the duplicate is
// what the os.File closes, libibverbs closes the original). [verbs.CompChannel.Wait]
// parks the goroutine there, never an OS thread, calls ibv_get_cq_event when the fd is
// readable, looks the CQ up, then acknowledges the event (ibv_ack_cq_events), one
// event per call. Context cancellation sets a read deadline in the past. One goroutine
// per open context reads async events the same way: IBV_EVENT_CQ_ERR makes the CQ's
// Poll return verbs.ErrCQOverflow, and IBV_EVENT_QP_FATAL, _REQ_ERR and _ACCESS_ERR
// record the QP as ERROR. Every event is then queued, as a verbs.AsyncEvent naming its
// CQ, QP number or port, for WaitAsyncEvent, and acknowledged; an async fd that fails
// (the device is gone) queues EventDeviceFatal. It stops when the context is closed.
// CQs are created on the completion vector the caller names, below the context's
// num_comp_vectors (DeviceAttr.NumCompVectors).
//
// # Errors
//
// Errors name the layer and operation and match both the verbs sentinel and the
// errno: "ibv: create qp: out of resources (ENOMEM)". ENOMEM is
// verbs.ErrNoResources from create and register calls and verbs.ErrQueueFull from
// posts; EINVAL is verbs.ErrInvalidArgument from create calls and
// verbs.ErrInvalidState from ibv_modify_qp and posts; EBUSY is verbs.ErrBusy.
// Requests that are invalid on their face (state, opcode, flags, SGE count, inline
// length, 24-bit PSNs and QPNs, 3-bit retry counts) are rejected in Go before the
// device sees them.
//
// # Queue pair transitions
//
// The attribute masks are those ibv_modify_qp(3) lists as required for IBV_QPT_RC:
//
//	RESET→INIT  STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
//	INIT→RTR    STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
//	RTR→RTS     STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC
//	→ERROR, →RESET  STATE
//
// The address vector sets is_global and the GRH (dgid, sgid_index, hop_limit) when
// [verbs.AddressVector.IsGlobal] is set, as RoCE requires; a HopLimit of 0 is sent as
// 64. [verbs.DeviceAttr.MaxInline], which ibv_query_device does not report, is probed
// once per device by creating a throwaway QP with decreasing max_inline_data.
//
// Beyond verbs.QP, a QP has Caps() (the capacities ibv_create_qp granted) and, beyond
// verbs.CQ, a CQ has Capacity() (the entries ibv_create_cq granted), as the
// conformance suite's optional CapsReporter and CapacityReporter ask.
//
// # Testing
//
// The sysfs reading is tested against fake trees under testdata/sysfs-* in every
// build, each fed through the selector (RoCE v1/v2, IPv4/IPv6, link-local zones, GID
// holes, down ports, InfiniBand with several HCAs, iWARP). With the tag, the provider's cgo plumbing runs against testdata/fakeverbs, a
// test double of libibverbs.so.1 that the tests compile and load in a child process
// (LD_LIBRARY_PATH): it checks masks, byte order and event acknowledgement, but models
// no hardware. The conformance suite (verbs/verbstest) runs against the real library
// when a device with an active port is present and skips, saying why, otherwise.
//
// # Device, port and GID selection
//
// This package does not choose: [verbs.Selector] does, for every provider, from the
// [verbs.DeviceAttr] that Devices returns. What the selector needs beyond ibv_query_*
// comes from sysfs: each port's netdevs ([verbs.PortAttr.Netdevs]: the netdevs of its
// RoCE GIDs, and on InfiniBand its IPoIB interfaces) and the device's transport
// ([verbs.DeviceAttr.Transport], from node_type: iWARP devices are refused). Under the
// sysfs root (normally /sys) it reads:
//
//	class/infiniband/<dev>/node_type                    "1: CA", "4: RNIC" (iWARP)
//	class/infiniband/<dev>/ports/<n>/state              "4: ACTIVE"
//	class/infiniband/<dev>/ports/<n>/link_layer         "Ethernet", "InfiniBand"
//	class/infiniband/<dev>/ports/<n>/gids/<i>           the GID, as an IPv6 address
//	class/infiniband/<dev>/ports/<n>/gid_attrs/types/<i> "RoCE v2", "IB/RoCE v1"
//	class/infiniband/<dev>/ports/<n>/gid_attrs/ndevs/<i> the netdev of a RoCE GID
//	class/infiniband/<dev>/device/net/<if>/dev_port     the 0-based port of an IPoIB netdev
//
// Port GID tables in [verbs.PortAttr.GIDs] come from the same files ([ReadGIDTable]).
//
// # Checklist: C fields and the man pages they come from
//
// Every field of a libibverbs structure this package reads or writes, with the man
// page (section 3) that defines it. "in" is written by this package, "out" read.
//
//	struct ibv_device                      ibv_get_device_list(3), ibv_get_device_name(3)
//	  (opaque; only passed to ibv_get_device_name and ibv_open_device)
//	struct ibv_context                     ibv_open_device(3)
//	  async_fd                out          ibv_get_async_event(3) (set O_NONBLOCK, polled)
//	  ops.post_send, .post_recv, .poll_cq, .req_notify_cq
//	                          out          via verbs.h's inlines: ibv_post_send(3),
//	                                       ibv_post_recv(3), ibv_poll_cq(3), ibv_req_notify_cq(3)
//	  abi_compat, verbs_context.sz, .query_port
//	                          out          via verbs.h's verbs_get_ctx_op, as its ibv_query_port does
//	struct ibv_device_attr                 ibv_query_device(3)
//	  node_guid               out          network byte order: read big-endian
//	  max_mr_size, max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr
//	                          out          DeviceAttr limits
//	  phys_port_cnt           out          ports are 1..phys_port_cnt
//	struct ibv_port_attr                   ibv_query_port(3)
//	  state, max_mtu, active_mtu, lid, link_layer
//	                          out          PortAttr (link_layer: IBV_LINK_LAYER_*)
//	struct ibv_comp_channel                ibv_create_comp_channel(3)
//	  fd                      out          ibv_get_cq_event(3) (set O_NONBLOCK, polled)
//	struct ibv_cq                          ibv_create_cq(3)
//	  cqe                     out          actual size (>= asked): CQ Capacity()
//	struct ibv_mr                          ibv_reg_mr(3)
//	  addr, lkey, rkey        out          MR.Addr, LKey, RKey
//	struct ibv_qp                          ibv_create_qp(3)
//	  qp_num                  out          QP.QPN
//	struct ibv_qp_init_attr                ibv_create_qp(3)
//	  qp_context, srq         in           NULL
//	  send_cq, recv_cq        in
//	  cap.max_send_wr, .max_recv_wr, .max_send_sge, .max_recv_sge, .max_inline_data
//	                          in, out      asked for, then granted (>= asked)
//	  qp_type                 in           IBV_QPT_RC
//	  sq_sig_all              in           QPInitAttr.SignalAll
//	struct ibv_qp_attr                     ibv_modify_qp(3), ibv_query_qp(3)
//	  qp_state                in, out      target state; current state from ibv_query_qp
//	  pkey_index, port_num, qp_access_flags
//	                          in           RESET→INIT
//	  path_mtu, dest_qp_num, rq_psn, max_dest_rd_atomic, min_rnr_timer, ah_attr
//	                          in           INIT→RTR
//	  timeout, retry_cnt, rnr_retry, sq_psn, max_rd_atomic
//	                          in           RTR→RTS
//	struct ibv_ah_attr                     ibv_create_ah(3) (referenced by ibv_modify_qp(3))
//	  dlid, port_num, is_global
//	                          in
//	  sl, src_path_bits, static_rate
//	                          in           0
//	  grh.dgid                in           16 raw bytes, network order (union ibv_gid)
//	  grh.sgid_index, grh.hop_limit
//	                          in           hop_limit 0 is sent as 64
//	  grh.flow_label, grh.traffic_class
//	                          in           0
//	struct ibv_send_wr                     ibv_post_send(3)
//	  wr_id, next, sg_list, num_sge, opcode, send_flags
//	                          in
//	  imm_data                in           network byte order: htonl(SendWR.Imm), *_WITH_IMM only
//	  wr.rdma.remote_addr, wr.rdma.rkey
//	                          in           RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ only
//	struct ibv_recv_wr                     ibv_post_recv(3)
//	  wr_id, next, sg_list, num_sge
//	                          in
//	struct ibv_sge                         ibv_post_send(3), ibv_post_recv(3)
//	  addr, length, lkey      in
//	struct ibv_wc                          ibv_poll_cq(3)
//	  wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp
//	                          out
//	  imm_data                out          network byte order: ntohl, valid with IBV_WC_WITH_IMM
//	  wc_flags                out          only IBV_WC_WITH_IMM is passed on
//	struct ibv_async_event                 ibv_get_async_event(3)
//	  event_type              out
//	  element.cq, element.qp, element.port_num
//	                          out          by event type
//
// Functions resolved with dlsym: ibv_get_device_list, ibv_free_device_list,
// ibv_get_device_name, ibv_open_device, ibv_close_device, ibv_query_device,
// ibv_query_port, ibv_alloc_pd, ibv_dealloc_pd, ibv_reg_mr, ibv_dereg_mr,
// ibv_create_comp_channel, ibv_destroy_comp_channel, ibv_create_cq, ibv_destroy_cq,
// ibv_get_cq_event, ibv_ack_cq_events, ibv_create_qp, ibv_modify_qp, ibv_query_qp,
// ibv_destroy_qp, ibv_get_async_event, ibv_ack_async_event.
package ibv

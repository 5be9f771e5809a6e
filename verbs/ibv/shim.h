// shim.h: the C side of package ibv (build tag rdma).
//
// libibverbs is not linked: lib_rdma.go opens it with dlopen and fills rsock_ibv with
// the exported functions this package calls. Everything else here is a static inline
// helper, so each Go file that includes this header gets its own copy and no symbol
// of libibverbs is referenced at link time.
//
// Two rules keep the link free of libibverbs:
//   - The exported functions are called only through rsock_ibv. Its members drop the
//     ibv_ prefix because verbs.h defines function-like macros named ibv_query_port,
//     ibv_reg_mr and others that would otherwise expand here.
//   - The fast-path calls ibv_post_send, ibv_post_recv, ibv_poll_cq and
//     ibv_req_notify_cq are verbs.h's own static inline functions: they dispatch through
//     the context's ops table and reference no symbol.
//
// No pointer into Go memory is stored by any function here.

#ifndef RSOCK_IBV_SHIM_H
#define RSOCK_IBV_SHIM_H

#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

// rsock_ibv_syms holds the functions resolved from libibverbs.so.1. The comment on
// each names the symbol version asked for (see rsock_ibv_load in lib_rdma.go).
struct rsock_ibv_syms {
	struct ibv_device **(*get_device_list)(int *num_devices);       // IBVERBS_1.1
	void (*free_device_list)(struct ibv_device **list);             // IBVERBS_1.1
	const char *(*get_device_name)(struct ibv_device *device);      // IBVERBS_1.1
	struct ibv_context *(*open_device)(struct ibv_device *device);  // IBVERBS_1.1
	int (*close_device)(struct ibv_context *context);               // IBVERBS_1.1
	int (*query_device)(struct ibv_context *context,
			    struct ibv_device_attr *device_attr);       // IBVERBS_1.1
	int (*query_port)(struct ibv_context *context, uint8_t port_num,
			  struct _compat_ibv_port_attr *port_attr);     // IBVERBS_1.1
	struct ibv_pd *(*alloc_pd)(struct ibv_context *context);        // IBVERBS_1.1
	int (*dealloc_pd)(struct ibv_pd *pd);                           // IBVERBS_1.1
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length,
				 int access);                           // IBVERBS_1.1
	int (*dereg_mr)(struct ibv_mr *mr);                             // IBVERBS_1.1
	struct ibv_comp_channel *(*create_comp_channel)(
		struct ibv_context *context);                           // IBVERBS_1.0
	int (*destroy_comp_channel)(struct ibv_comp_channel *channel);  // IBVERBS_1.0
	struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe,
				    void *cq_context,
				    struct ibv_comp_channel *channel,
				    int comp_vector);                   // IBVERBS_1.1
	int (*destroy_cq)(struct ibv_cq *cq);                           // IBVERBS_1.1
	int (*get_cq_event)(struct ibv_comp_channel *channel,
			    struct ibv_cq **cq, void **cq_context);     // IBVERBS_1.1
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents); // IBVERBS_1.1
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd,
				    struct ibv_qp_init_attr *qp_init_attr); // IBVERBS_1.1
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int attr_mask);                                // IBVERBS_1.1
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
			struct ibv_qp_init_attr *init_attr);            // IBVERBS_1.1
	int (*destroy_qp)(struct ibv_qp *qp);                           // IBVERBS_1.1
	int (*get_async_event)(struct ibv_context *context,
			       struct ibv_async_event *event);          // IBVERBS_1.1
	void (*ack_async_event)(struct ibv_async_event *event);         // IBVERBS_1.1

	// Optional (rdma-core 30 and later); NULL when the library lacks it.
	ssize_t (*query_gid_table)(struct ibv_context *context,
				   struct ibv_gid_entry *entries, size_t max_entries,
				   uint32_t flags, size_t entry_size);  // IBVERBS_1.11
};

// rsock_ibv is defined in lib_rdma.go's preamble and filled once by rsock_ibv_load.
extern struct rsock_ibv_syms rsock_ibv;

// ---- Thin wrappers: Go cannot call through a C function pointer. ----

static inline struct ibv_device **rsock_get_device_list(int *n) { return rsock_ibv.get_device_list(n); }
static inline void rsock_free_device_list(struct ibv_device **l) { rsock_ibv.free_device_list(l); }
static inline const char *rsock_get_device_name(struct ibv_device *d) { return rsock_ibv.get_device_name(d); }
static inline struct ibv_context *rsock_open_device(struct ibv_device *d) { return rsock_ibv.open_device(d); }
static inline int rsock_close_device(struct ibv_context *c) { return rsock_ibv.close_device(c); }
static inline int rsock_query_device(struct ibv_context *c, struct ibv_device_attr *a) { return rsock_ibv.query_device(c, a); }
static inline struct ibv_pd *rsock_alloc_pd(struct ibv_context *c) { return rsock_ibv.alloc_pd(c); }
static inline int rsock_dealloc_pd(struct ibv_pd *pd) { return rsock_ibv.dealloc_pd(pd); }
static inline int rsock_dereg_mr(struct ibv_mr *mr) { return rsock_ibv.dereg_mr(mr); }
static inline struct ibv_comp_channel *rsock_create_comp_channel(struct ibv_context *c) { return rsock_ibv.create_comp_channel(c); }
static inline int rsock_destroy_comp_channel(struct ibv_comp_channel *ch) { return rsock_ibv.destroy_comp_channel(ch); }
static inline int rsock_destroy_cq(struct ibv_cq *cq) { return rsock_ibv.destroy_cq(cq); }
static inline void rsock_ack_cq_events(struct ibv_cq *cq, unsigned int n) { rsock_ibv.ack_cq_events(cq, n); }
static inline struct ibv_qp *rsock_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) { return rsock_ibv.create_qp(pd, a); }
static inline int rsock_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) { return rsock_ibv.modify_qp(qp, a, mask); }
static inline int rsock_destroy_qp(struct ibv_qp *qp) { return rsock_ibv.destroy_qp(qp); }
static inline void rsock_ack_async_event(struct ibv_async_event *ev) { rsock_ibv.ack_async_event(ev); }

static inline struct ibv_mr *rsock_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return rsock_ibv.reg_mr(pd, addr, length, access);
}

static inline struct ibv_cq *rsock_create_cq(struct ibv_context *c, int cqe, struct ibv_comp_channel *ch, int vector)
{
	// cq_context stays NULL: C keeps no pointer to Go.
	return rsock_ibv.create_cq(c, cqe, NULL, ch, vector);
}

static inline int rsock_num_comp_vectors(struct ibv_context *c) { return c->num_comp_vectors; }

// rsock_query_gid_table is verbs.h's ibv_query_gid_table: every valid entry of every
// port's GID table, in one call. It fails with EOPNOTSUPP where libibverbs lacks it.
static inline ssize_t rsock_query_gid_table(struct ibv_context *c, struct ibv_gid_entry *e, size_t max)
{
	if (rsock_ibv.query_gid_table == NULL) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return rsock_ibv.query_gid_table(c, e, max, 0, sizeof(*e));
}

static inline int rsock_comp_channel_fd(struct ibv_comp_channel *ch) { return ch->fd; }
static inline int rsock_async_fd(struct ibv_context *c) { return c->async_fd; }
static inline int rsock_cq_size(struct ibv_cq *cq) { return cq->cqe; }
static inline uint32_t rsock_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

// rsock_query_port is what verbs.h's ibv_query_port macro does, minus the link-time
// reference to the ibv_query_port symbol: use the extended context's query_port op,
// which takes the full struct ibv_port_attr, and fall back to the exported (dlsym'ed)
// function, which fills the compat prefix of it.
static inline int rsock_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *attr)
{
	struct verbs_context *vctx = verbs_get_ctx_op(c, query_port);

	if (vctx == NULL) {
		memset(attr, 0, sizeof(*attr));
		return rsock_ibv.query_port(c, port, (struct _compat_ibv_port_attr *)attr);
	}
	return vctx->query_port(c, port, attr, sizeof(*attr));
}

// rsock_query_qp_state returns the QP's current state (enum ibv_qp_state), or -1 with
// errno set.
static inline int rsock_query_qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	int rc;

	memset(&attr, 0, sizeof(attr));
	memset(&init, 0, sizeof(init));
	rc = rsock_ibv.query_qp(qp, &attr, IBV_QP_STATE, &init);
	if (rc != 0) {
		errno = rc > 0 ? rc : -rc;
		return -1;
	}
	return (int)attr.qp_state;
}

// rsock_query_qp queries the QP's state, path MTU, destination QPN and address vector
// (ibv_query_qp). It returns 0, or an errno.
static inline int rsock_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr)
{
	struct ibv_qp_init_attr init;
	int rc;

	memset(attr, 0, sizeof(*attr));
	memset(&init, 0, sizeof(init));
	rc = rsock_ibv.query_qp(qp, attr, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_AV, &init);
	return rc < 0 ? -rc : rc;
}

// ---- Completion channel and async events ----

// rsock_get_cq_event takes one event from a completion channel whose fd is
// non-blocking. It returns the CQ the event is for, or NULL with errno set (EAGAIN:
// none pending). The caller must acknowledge the event with rsock_ack_cq_events.
static inline struct ibv_cq *rsock_get_cq_event(struct ibv_comp_channel *ch)
{
	struct ibv_cq *cq = NULL;
	void *cq_context = NULL;

	if (rsock_ibv.get_cq_event(ch, &cq, &cq_context) != 0)
		return NULL;
	return cq;
}

// rsock_async_element is what an async event concerns: a CQ or QP pointer, a port
// number, or 0.
static inline uintptr_t rsock_async_element(const struct ibv_async_event *ev)
{
	switch (ev->event_type) {
	case IBV_EVENT_CQ_ERR:
		return (uintptr_t)ev->element.cq;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		return (uintptr_t)ev->element.qp;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		return (uintptr_t)ev->element.port_num;
	default:
		return 0;
	}
}

// rsock_get_async_event reads one async event of a context whose async fd is
// non-blocking into *ev. It returns the event type, or -1 with errno set (EAGAIN:
// none pending). The caller must acknowledge it with rsock_ack_async_event.
static inline int rsock_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	if (rsock_ibv.get_async_event(c, ev) != 0)
		return -1;
	return (int)ev->event_type;
}

// ---- Send queue ----

// rsock_send is one send work request as the Go side writes it: fixed-width fields,
// no unions, immediate data in host order. rsock_post_send turns it into an
// ibv_send_wr.
struct rsock_send {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t imm;
	uint32_t opcode;
	uint32_t send_flags;
	uint32_t num_sge;
	uint32_t pad;
};

// rsock_sq is a QP's send-side scratch memory, allocated once at QP creation:
// max_wr requests, each with room for max_sge SGEs at sges[i*max_sge].
struct rsock_sq {
	struct ibv_qp *qp;
	int max_wr;
	int max_sge;
	int bad; // after a failed post: index of the request the provider rejected
	struct rsock_send *flat;
	struct ibv_send_wr *wrs;
	struct ibv_sge *sges;
};

// rsock_post_send posts flat[0..n) as one linked list of ibv_send_wr. It returns 0 or
// the errno value from ibv_post_send, with sq->bad naming the rejected request.
static inline int rsock_post_send(struct rsock_sq *sq, int n)
{
	struct ibv_send_wr *bad = NULL;
	int i, rc;

	for (i = 0; i < n; i++) {
		const struct rsock_send *f = &sq->flat[i];
		struct ibv_send_wr *wr = &sq->wrs[i];

		memset(wr, 0, sizeof(*wr));
		wr->wr_id = f->wr_id;
		wr->next = i + 1 < n ? &sq->wrs[i + 1] : NULL;
		wr->sg_list = f->num_sge > 0 ? &sq->sges[(size_t)i * (size_t)sq->max_sge] : NULL;
		wr->num_sge = (int)f->num_sge;
		wr->opcode = (enum ibv_wr_opcode)f->opcode;
		wr->send_flags = f->send_flags;
		switch (f->opcode) {
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			wr->imm_data = htonl(f->imm); // ibv_post_send(3): network byte order
			wr->wr.rdma.remote_addr = f->remote_addr;
			wr->wr.rdma.rkey = f->rkey;
			break;
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_READ:
			wr->wr.rdma.remote_addr = f->remote_addr;
			wr->wr.rdma.rkey = f->rkey;
			break;
		case IBV_WR_SEND_WITH_IMM:
			wr->imm_data = htonl(f->imm);
			break;
		default:
			break;
		}
	}
	sq->bad = -1;
	rc = ibv_post_send(sq->qp, sq->wrs, &bad);
	if (rc != 0) {
		sq->bad = bad != NULL ? (int)(bad - sq->wrs) : 0;
		if (rc < 0)
			rc = -rc;
	}
	return rc;
}

// ---- Receive queue ----

// rsock_rq is a QP's receive-side scratch memory. The Go side writes wrs[i].wr_id,
// wrs[i].num_sge and the SGEs at sges[i*max_sge]; rsock_post_recv links the list.
struct rsock_rq {
	struct ibv_qp *qp;
	int max_wr;
	int max_sge;
	int bad;
	struct ibv_recv_wr *wrs;
	struct ibv_sge *sges;
};

static inline int rsock_post_recv(struct rsock_rq *rq, int n)
{
	struct ibv_recv_wr *bad = NULL;
	int i, rc;

	for (i = 0; i < n; i++) {
		struct ibv_recv_wr *wr = &rq->wrs[i];

		wr->next = i + 1 < n ? &rq->wrs[i + 1] : NULL;
		wr->sg_list = wr->num_sge > 0 ? &rq->sges[(size_t)i * (size_t)rq->max_sge] : NULL;
	}
	rq->bad = -1;
	rc = ibv_post_recv(rq->qp, rq->wrs, &bad);
	if (rc != 0) {
		rq->bad = bad != NULL ? (int)(bad - rq->wrs) : 0;
		if (rc < 0)
			rc = -rc;
	}
	return rc;
}

// ---- Completion queue ----

// rsock_wc is one completion as the Go side reads it: no unions, immediate data
// already in host order.
struct rsock_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t wc_flags;
};

// rsock_cq is a CQ's polling scratch memory, allocated once at CQ creation.
struct rsock_cq {
	struct ibv_cq *cq;
	int max;
	struct ibv_wc *wc;
	struct rsock_wc *out;
};

// rsock_poll_cq polls up to n (at most cq->max) completions into cq->out. It returns
// how many, or a negative value if ibv_poll_cq failed.
static inline int rsock_poll_cq(struct rsock_cq *c, int n)
{
	int i, got;

	if (n > c->max)
		n = c->max;
	got = ibv_poll_cq(c->cq, n, c->wc);
	for (i = 0; i < got; i++) {
		const struct ibv_wc *wc = &c->wc[i];
		struct rsock_wc *o = &c->out[i];

		o->wr_id = wc->wr_id;
		o->status = (uint32_t)wc->status;
		o->opcode = (uint32_t)wc->opcode;
		o->vendor_err = wc->vendor_err;
		o->byte_len = wc->byte_len;
		// ibv_poll_cq(3): imm_data is in network byte order, valid with IBV_WC_WITH_IMM.
		o->imm = (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0;
		o->qp_num = wc->qp_num;
		o->src_qp = wc->src_qp;
		o->wc_flags = wc->wc_flags;
	}
	return got;
}

static inline int rsock_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	int rc = ibv_req_notify_cq(cq, solicited_only);

	return rc < 0 ? -rc : rc;
}

#endif // RSOCK_IBV_SHIM_H

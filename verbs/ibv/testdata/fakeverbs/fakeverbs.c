// fakeverbs.c: a stand-in for libibverbs.so.1, used by package ibv's tests
// (fakelib_rdma_test.go) on machines without an RDMA device.
//
// It is NOT a model of RDMA hardware and says nothing about how a real device
// behaves: verbs/soft and the conformance suite are for that. It exists to run the
// Go <-> C plumbing of package ibv for real: dlopen and versioned dlsym, the inline
// fast paths through the context ops table, the C-side work request and completion
// arrays, byte order of immediate data, the completion channel and async event fds
// through the netpoller, attribute masks of QP transitions, and error returns.
//
// One device, "fake0", with one ACTIVE Ethernet port. QPs are connected inside the
// process by QP number; a post executes at once and pushes completions.
//
// What the fake checks, failing the call with EINVAL when violated:
//   - ibv_modify_qp masks are exactly those ibv_modify_qp(3) requires for RC;
//   - INIT->RTR carries a GRH (is_global, hop_limit != 0) on port 1;
//   - cq_context and qp_context are NULL (no Go pointer kept by C).
// Test hooks:
//   - a successful *_WITH_IMM send completion carries ntohl(imm_data) in vendor_err,
//     so a test can see the immediate left Go in network byte order;
//   - FAKEVERBS_NODEV=1 makes ibv_get_device_list return no device;
//   - ibv_get_device_list fails with ENOSYS in a process out of file descriptors, as
//     libibverbs does, and lists no device with one descriptor free (it needs two);
//   - FAKEVERBS_COMPAT=1 opens a context without the extended ops, so that
//     ibv_query_port goes through the exported compat function;
//   - _ibv_query_gid_table fails with EOPNOTSUPP (as on a kernel without the ioctl),
//     so that GID tables come from the fake sysfs tree, unless FAKEVERBS_GIDTABLE=1:
//     then it returns a table with holes that sysfs-fake does not hold (see
//     fakeGIDTable in fakelib_rdma_test.go), and an entry of a second port.
// Build: see fakelib_rdma_test.go (gcc -shared with fakeverbs.map for symbol versions).

#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// verbs.h defines these as macros; the library exports them as functions.
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_get_device_list

#define MAX_QPS 64
#define MAX_MRS 256
#define MAX_SGE 4
#define MAX_INLINE 512
#define MAX_RD_ATOMIC 16
#define GID_TABLE 8

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct fake_ctx {
	struct verbs_context vctx; // vctx.context is what callers see
	int async_wfd;
	int async_events, async_acks;
};

struct fake_pd {
	struct ibv_pd pd;
	int users; // MRs and QPs
};

struct fake_mr {
	struct ibv_mr mr;
	int access;
	struct fake_pd *pd;
};

struct fake_channel {
	struct ibv_comp_channel ch;
	int wfd;
	int cqs;
};

struct fake_cq {
	struct ibv_cq cq;
	struct fake_channel *channel;
	struct ibv_wc *ring;
	int head, count;
	int armed; // 0, 1 any, 2 solicited only
	int qps;
	int overflowed;
	unsigned events, acks;
};

struct fake_rwqe {
	uint64_t wr_id;
	int num_sge;
	struct ibv_sge sge[MAX_SGE];
};

struct fake_qp {
	struct ibv_qp qp;
	struct fake_pd *pd;
	struct fake_cq *scq, *rcq;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	uint32_t dest_qpn;
	int access;
	struct fake_rwqe *rq;
	int rq_head, rq_count;
};

static struct ibv_device fake_dev;
static struct fake_qp *qps[MAX_QPS];
static struct fake_mr *mrs[MAX_MRS];
static uint32_t next_qpn = 0x100;
static uint32_t next_key = 0x1000;

static struct fake_ctx *ctx_of(struct ibv_context *c)
{
	return (struct fake_ctx *)((char *)c - offsetof(struct fake_ctx, vctx.context));
}

// ---- devices ----

struct ibv_device **ibv_get_device_list(int *num)
{
	struct ibv_device **list = calloc(2, sizeof(*list));
	int fd, devfd;

	if (list == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	// libibverbs lists devices from sysfs, and a process out of descriptors gets NULL
	// with ENOSYS from it, as if the kernel had no RDMA support (seen with Debian 12's rdma-core).
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		free(list);
		errno = ENOSYS;
		return NULL;
	}
	// With that descriptor (libibverbs' netlink socket) held, the device's sysfs files:
	// libibverbs leaves out a device whose files it cannot open, so a process with one
	// descriptor free gets an empty list, and no error.
	devfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	close(fd);
	if (num != NULL)
		*num = 0;
	if (devfd < 0)
		return list;
	close(devfd);
	strcpy(fake_dev.name, "fake0");
	strcpy(fake_dev.dev_name, "uverbs0");
	fake_dev.node_type = IBV_NODE_CA;
	fake_dev.transport_type = IBV_TRANSPORT_IB;
	if (getenv("FAKEVERBS_NODEV") == NULL)
		list[0] = &fake_dev;
	if (num != NULL)
		*num = list[0] != NULL ? 1 : 0;
	return list;
}

void ibv_free_device_list(struct ibv_device **list) { free(list); }

const char *ibv_get_device_name(struct ibv_device *dev) { return dev->name; }

static int fill_port(uint8_t port, struct ibv_port_attr *a)
{
	if (port != 1)
		return EINVAL;
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_1024;
	a->gid_tbl_len = GID_TABLE;
	a->lid = 0;
	a->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

static int ext_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a, size_t len)
{
	if (len != sizeof(*a))
		return EINVAL;
	memset(a, 0, sizeof(*a));
	return fill_port(port, a);
}

int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *a)
{
	// The compat struct is the prefix of struct ibv_port_attr up to link_layer.
	return fill_port(port, (struct ibv_port_attr *)a);
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only);
static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
	struct fake_ctx *f = calloc(1, sizeof(*f));
	int p[2];

	if (f == NULL || pipe2(p, O_CLOEXEC) != 0) {
		free(f);
		errno = ENOMEM;
		return NULL;
	}
	f->vctx.sz = sizeof(struct verbs_context);
	f->vctx.query_port = ext_query_port;
	f->vctx.context.device = dev;
	f->vctx.context.async_fd = p[0];
	f->vctx.context.num_comp_vectors = 1;
	f->vctx.context.abi_compat = getenv("FAKEVERBS_COMPAT") ? NULL : __VERBS_ABI_IS_EXTENDED;
	f->vctx.context.ops.poll_cq = fake_poll_cq;
	f->vctx.context.ops.req_notify_cq = fake_req_notify_cq;
	f->vctx.context.ops.post_send = fake_post_send;
	f->vctx.context.ops.post_recv = fake_post_recv;
	f->async_wfd = p[1];
	return &f->vctx.context;
}

int ibv_close_device(struct ibv_context *c)
{
	struct fake_ctx *f = ctx_of(c);

	if (f->async_acks != f->async_events) {
		fprintf(stderr, "fakeverbs: close_device with %d unacknowledged async events\n",
			f->async_events - f->async_acks);
		abort();
	}
	close(c->async_fd);
	close(f->async_wfd);
	free(f);
	return 0;
}

static void fake_gid_entry(struct ibv_gid_entry *e, uint32_t port, uint32_t index, uint32_t type,
			   uint32_t ifindex, const char *addr)
{
	memset(e, 0, sizeof(*e));
	inet_pton(AF_INET6, addr, e->gid.raw);
	e->port_num = port;
	e->gid_index = index;
	e->gid_type = type;
	e->ndev_ifindex = ifindex;
}

ssize_t _ibv_query_gid_table(struct ibv_context *c, struct ibv_gid_entry *entries,
			     size_t max_entries, uint32_t flags, size_t entry_size)
{
	if (!getenv("FAKEVERBS_GIDTABLE"))
		return -EOPNOTSUPP;
	if (flags != 0 || entry_size != sizeof(struct ibv_gid_entry))
		return -EINVAL;
	if (max_entries < 4)
		return -EINVAL; // as the kernel: the table does not fit
	fake_gid_entry(&entries[0], 1, 0, IBV_GID_TYPE_ROCE_V1, 1, "fe80::a00:27ff:fe00:7");
	fake_gid_entry(&entries[1], 1, 6, IBV_GID_TYPE_ROCE_V2, 1, "::ffff:10.7.0.8");
	fake_gid_entry(&entries[2], 2, 1, IBV_GID_TYPE_ROCE_V2, 1, "::ffff:10.7.0.9");
	fake_gid_entry(&entries[3], 1, 3, IBV_GID_TYPE_IB, 0, "fd00::7");
	return 4;
}

int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	strcpy(a->fw_ver, "0.0.0");
	a->node_guid = htobe64(0x0002c90300a1b2c3ULL);
	a->max_mr_size = 1ULL << 40;
	a->max_qp = MAX_QPS;
	a->max_qp_wr = 1024;
	a->max_sge = MAX_SGE;
	a->max_cq = 64;
	a->max_cqe = 4096;
	a->max_mr = MAX_MRS;
	a->max_pd = 16;
	a->max_qp_rd_atom = MAX_RD_ATOMIC;
	a->phys_port_cnt = 1;
	return 0;
}

// ---- PD and MR ----

struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct fake_pd *p = calloc(1, sizeof(*p));

	if (p == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	p->pd.context = c;
	return &p->pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct fake_pd *p = (struct fake_pd *)pd;

	pthread_mutex_lock(&mu);
	if (p->users > 0) {
		pthread_mutex_unlock(&mu);
		return EBUSY;
	}
	pthread_mutex_unlock(&mu);
	free(p);
	return 0;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	struct fake_mr *m;
	int i;

	if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (m == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&mu);
	for (i = 0; i < MAX_MRS && mrs[i] != NULL; i++)
		;
	if (i == MAX_MRS) {
		pthread_mutex_unlock(&mu);
		free(m);
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->mr.lkey = next_key;
	m->mr.rkey = next_key + 1;
	next_key += 2;
	m->access = access;
	m->pd = (struct fake_pd *)pd;
	m->pd->users++;
	mrs[i] = m;
	pthread_mutex_unlock(&mu);
	return &m->mr;
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct fake_mr *m = (struct fake_mr *)mr;
	int i;

	pthread_mutex_lock(&mu);
	for (i = 0; i < MAX_MRS; i++)
		if (mrs[i] == m)
			mrs[i] = NULL;
	m->pd->users--;
	pthread_mutex_unlock(&mu);
	free(m);
	return 0;
}

// find_mr returns the MR whose key is key (lkey or rkey) and holds [addr, addr+len).
static struct fake_mr *find_mr(uint32_t key, int remote, uint64_t addr, uint64_t len)
{
	int i;

	for (i = 0; i < MAX_MRS; i++) {
		struct fake_mr *m = mrs[i];
		uint64_t base;

		if (m == NULL || (remote ? m->mr.rkey : m->mr.lkey) != key)
			continue;
		base = (uint64_t)(uintptr_t)m->mr.addr;
		if (addr < base || addr + len > base + m->mr.length)
			return NULL;
		return m;
	}
	return NULL;
}

// ---- completion channels and CQs ----

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c)
{
	struct fake_channel *ch = calloc(1, sizeof(*ch));
	int p[2];

	if (ch == NULL || pipe2(p, O_CLOEXEC) != 0) {
		free(ch);
		errno = ENOMEM;
		return NULL;
	}
	ch->ch.context = c;
	ch->ch.fd = p[0];
	ch->wfd = p[1];
	return &ch->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct fake_channel *ch = (struct fake_channel *)channel;

	if (ch->cqs > 0)
		return EBUSY;
	close(ch->ch.fd);
	close(ch->wfd);
	free(ch);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct fake_cq *q;

	if (cqe <= 0 || cqe > 4096 || cq_context != NULL || comp_vector != 0) {
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (q == NULL || (q->ring = calloc((size_t)cqe, sizeof(struct ibv_wc))) == NULL) {
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->cq.context = c;
	q->cq.channel = channel;
	q->cq.cqe = cqe;
	q->channel = (struct fake_channel *)channel;
	pthread_mutex_lock(&mu);
	if (q->channel != NULL)
		q->channel->cqs++;
	pthread_mutex_unlock(&mu);
	return &q->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct fake_cq *q = (struct fake_cq *)cq;

	pthread_mutex_lock(&mu);
	if (q->qps > 0) {
		pthread_mutex_unlock(&mu);
		return EBUSY;
	}
	if (q->acks != q->events) {
		fprintf(stderr, "fakeverbs: destroy_cq with %u unacknowledged events\n", q->events - q->acks);
		abort();
	}
	if (q->channel != NULL)
		q->channel->cqs--;
	pthread_mutex_unlock(&mu);
	free(q->ring);
	free(q);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct fake_cq *q;
	ssize_t n = read(channel->fd, &q, sizeof(q));

	if (n != sizeof(q))
		return -1; // errno from read: EAGAIN when the fd is non-blocking and empty
	pthread_mutex_lock(&mu);
	q->events++;
	pthread_mutex_unlock(&mu);
	*cq = &q->cq;
	*cq_context = q->cq.cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	struct fake_cq *q = (struct fake_cq *)cq;

	pthread_mutex_lock(&mu);
	q->acks += n;
	if (q->acks > q->events) {
		fprintf(stderr, "fakeverbs: more CQ events acknowledged than delivered\n");
		abort();
	}
	pthread_mutex_unlock(&mu);
}

static void async_event(struct ibv_context *c, enum ibv_event_type type, struct ibv_cq *cq, struct ibv_qp *qp)
{
	struct fake_ctx *f = ctx_of(c);
	struct ibv_async_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.event_type = type;
	if (cq != NULL)
		ev.element.cq = cq;
	else
		ev.element.qp = qp;
	if (write(f->async_wfd, &ev, sizeof(ev)) == sizeof(ev))
		f->async_events++;
}

int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	if (read(c->async_fd, ev, sizeof(*ev)) != sizeof(*ev))
		return -1;
	return 0;
}

void ibv_ack_async_event(struct ibv_async_event *ev)
{
	struct ibv_context *c = ev->event_type == IBV_EVENT_CQ_ERR ? ev->element.cq->context
								    : ev->element.qp->context;

	pthread_mutex_lock(&mu);
	ctx_of(c)->async_acks++;
	pthread_mutex_unlock(&mu);
}

// push adds a completion to q, with mu held.
static void push(struct fake_cq *q, const struct ibv_wc *wc, int solicited)
{
	if (q->count == q->cq.cqe) {
		if (!q->overflowed) {
			q->overflowed = 1;
			async_event(q->cq.context, IBV_EVENT_CQ_ERR, &q->cq, NULL);
		}
		return;
	}
	q->ring[(q->head + q->count) % q->cq.cqe] = *wc;
	q->count++;
	if (q->channel != NULL &&
	    (q->armed == 1 || (q->armed == 2 && (solicited || wc->status != IBV_WC_SUCCESS)))) {
		struct fake_cq *self = q;

		q->armed = 0;
		if (write(q->channel->wfd, &self, sizeof(self)) != sizeof(self))
			abort();
	}
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct fake_cq *q = (struct fake_cq *)cq;
	int i;

	pthread_mutex_lock(&mu);
	for (i = 0; i < n && q->count > 0; i++) {
		wc[i] = q->ring[q->head];
		q->head = (q->head + 1) % q->cq.cqe;
		q->count--;
	}
	pthread_mutex_unlock(&mu);
	return i;
}

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct fake_cq *q = (struct fake_cq *)cq;

	pthread_mutex_lock(&mu);
	q->armed = solicited_only ? 2 : 1;
	pthread_mutex_unlock(&mu);
	return 0;
}

// ---- QPs ----

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct fake_qp *q;
	int i;

	if (a->qp_type != IBV_QPT_RC || a->send_cq == NULL || a->recv_cq == NULL || a->srq != NULL ||
	    a->qp_context != NULL || a->cap.max_send_sge > MAX_SGE || a->cap.max_recv_sge > MAX_SGE ||
	    a->cap.max_inline_data > MAX_INLINE || a->cap.max_send_wr > 1024 || a->cap.max_recv_wr > 1024) {
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (q == NULL || (q->rq = calloc(a->cap.max_recv_wr + 1, sizeof(*q->rq))) == NULL) {
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&mu);
	for (i = 0; i < MAX_QPS && qps[i] != NULL; i++)
		;
	if (i == MAX_QPS) {
		pthread_mutex_unlock(&mu);
		free(q->rq);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->qp.context = pd->context;
	q->qp.pd = pd;
	q->qp.send_cq = a->send_cq;
	q->qp.recv_cq = a->recv_cq;
	q->qp.qp_num = next_qpn++;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = IBV_QPT_RC;
	q->pd = (struct fake_pd *)pd;
	q->scq = (struct fake_cq *)a->send_cq;
	q->rcq = (struct fake_cq *)a->recv_cq;
	// Grant what was asked, with the inline size rounded up to 64 bytes.
	a->cap.max_inline_data = (a->cap.max_inline_data + 63) / 64 * 64;
	if (a->cap.max_inline_data > MAX_INLINE)
		a->cap.max_inline_data = MAX_INLINE;
	q->cap = a->cap;
	q->sq_sig_all = a->sq_sig_all;
	q->pd->users++;
	q->scq->qps++;
	q->rcq->qps++;
	qps[i] = q;
	pthread_mutex_unlock(&mu);
	return &q->qp;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct fake_qp *q = (struct fake_qp *)qp;
	int i;

	pthread_mutex_lock(&mu);
	for (i = 0; i < MAX_QPS; i++)
		if (qps[i] == q)
			qps[i] = NULL;
	q->pd->users--;
	q->scq->qps--;
	q->rcq->qps--;
	pthread_mutex_unlock(&mu);
	free(q->rq);
	free(q);
	return 0;
}

static struct fake_qp *find_qp(uint32_t qpn)
{
	int i;

	for (i = 0; i < MAX_QPS; i++)
		if (qps[i] != NULL && qps[i]->qp.qp_num == qpn)
			return qps[i];
	return NULL;
}

// flush_rq completes every posted receive with IBV_WC_WR_FLUSH_ERR, with mu held.
static void flush_rq(struct fake_qp *q)
{
	while (q->rq_count > 0) {
		struct ibv_wc wc;

		memset(&wc, 0, sizeof(wc));
		wc.wr_id = q->rq[q->rq_head].wr_id;
		wc.status = IBV_WC_WR_FLUSH_ERR;
		wc.qp_num = q->qp.qp_num;
		push(q->rcq, &wc, 0);
		q->rq_head = (q->rq_head + 1) % (int)(q->cap.max_recv_wr + 1);
		q->rq_count--;
	}
}

#define RC_INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define RC_RTR_MASK (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | \
		     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define RC_RTS_MASK (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | \
		     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct fake_qp *q = (struct fake_qp *)qp;
	enum ibv_qp_state cur, next;
	int ok = 0;

	pthread_mutex_lock(&mu);
	cur = q->qp.state;
	next = a->qp_state;
	if (!(mask & IBV_QP_STATE)) {
		ok = 0;
	} else if (next == IBV_QPS_ERR || next == IBV_QPS_RESET) {
		ok = mask == IBV_QP_STATE;
	} else if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
		ok = mask == RC_INIT_MASK && a->port_num == 1;
		q->access = (int)a->qp_access_flags;
	} else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
		ok = mask == RC_RTR_MASK && a->ah_attr.is_global && a->ah_attr.grh.hop_limit != 0 &&
		     a->ah_attr.grh.sgid_index < GID_TABLE && a->ah_attr.port_num == 1 &&
		     a->path_mtu >= IBV_MTU_256 && a->path_mtu <= IBV_MTU_4096 &&
		     a->max_dest_rd_atomic <= MAX_RD_ATOMIC;
		q->dest_qpn = a->dest_qp_num;
	} else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
		ok = mask == RC_RTS_MASK && a->max_rd_atomic <= MAX_RD_ATOMIC;
	}
	if (!ok) {
		pthread_mutex_unlock(&mu);
		return EINVAL;
	}
	q->qp.state = next;
	if (next == IBV_QPS_ERR)
		flush_rq(q);
	if (next == IBV_QPS_RESET)
		q->rq_count = 0;
	pthread_mutex_unlock(&mu);
	return 0;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *init)
{
	pthread_mutex_lock(&mu);
	a->qp_state = qp->state;
	a->cur_qp_state = qp->state;
	pthread_mutex_unlock(&mu);
	return 0;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct fake_qp *q = (struct fake_qp *)qp;
	int slots = (int)q->cap.max_recv_wr + 1;

	pthread_mutex_lock(&mu);
	for (; wr != NULL; wr = wr->next) {
		struct fake_rwqe *e;
		int rc = 0;

		if (q->qp.state == IBV_QPS_RESET || wr->num_sge > (int)q->cap.max_recv_sge)
			rc = EINVAL;
		else if (q->rq_count >= (int)q->cap.max_recv_wr)
			rc = ENOMEM;
		if (rc != 0) {
			*bad = wr;
			pthread_mutex_unlock(&mu);
			return rc;
		}
		e = &q->rq[(q->rq_head + q->rq_count) % slots];
		e->wr_id = wr->wr_id;
		e->num_sge = wr->num_sge;
		if (wr->num_sge > 0)
			memcpy(e->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
		q->rq_count++;
		if (q->qp.state == IBV_QPS_ERR)
			flush_rq(q);
	}
	pthread_mutex_unlock(&mu);
	return 0;
}

// execute runs one send work request against its peer, with mu held, and returns
// the status of the sender's completion.
static enum ibv_wc_status execute(struct fake_qp *q, struct ibv_send_wr *wr, uint32_t *len)
{
	struct fake_qp *d = find_qp(q->dest_qpn);
	int inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
	int has_imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM;
	uint64_t total = 0;
	char *buf;
	int i;

	for (i = 0; i < wr->num_sge; i++) {
		struct ibv_sge *s = &wr->sg_list[i];

		if (!inl && find_mr(s->lkey, 0, s->addr, s->length) == NULL)
			return IBV_WC_LOC_PROT_ERR;
		total += s->length;
	}
	*len = (uint32_t)total;
	if (d == NULL || (d->qp.state != IBV_QPS_RTR && d->qp.state != IBV_QPS_RTS))
		return IBV_WC_RETRY_EXC_ERR;

	if (wr->opcode == IBV_WR_RDMA_READ) {
		struct fake_mr *m = find_mr(wr->wr.rdma.rkey, 1, wr->wr.rdma.remote_addr, total);
		const char *src;

		if (m == NULL || !(m->access & IBV_ACCESS_REMOTE_READ) || !(d->access & IBV_ACCESS_REMOTE_READ))
			return IBV_WC_REM_ACCESS_ERR;
		src = (const char *)(uintptr_t)wr->wr.rdma.remote_addr;
		for (i = 0; i < wr->num_sge; i++) {
			memcpy((void *)(uintptr_t)wr->sg_list[i].addr, src, wr->sg_list[i].length);
			src += wr->sg_list[i].length;
		}
		return IBV_WC_SUCCESS;
	}

	buf = malloc(total + 1);
	if (buf == NULL)
		return IBV_WC_GENERAL_ERR;
	total = 0;
	for (i = 0; i < wr->num_sge; i++) {
		memcpy(buf + total, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
		total += wr->sg_list[i].length;
	}

	if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
		struct fake_mr *m = find_mr(wr->wr.rdma.rkey, 1, wr->wr.rdma.remote_addr, total);

		if (m == NULL || !(m->access & IBV_ACCESS_REMOTE_WRITE) || !(d->access & IBV_ACCESS_REMOTE_WRITE)) {
			free(buf);
			return IBV_WC_REM_ACCESS_ERR;
		}
		if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM && d->rq_count == 0) {
			free(buf);
			return IBV_WC_RNR_RETRY_EXC_ERR;
		}
		memcpy((void *)(uintptr_t)wr->wr.rdma.remote_addr, buf, total);
	}

	if (wr->opcode != IBV_WR_RDMA_WRITE) {
		struct fake_rwqe *e;
		struct ibv_wc wc;
		uint64_t off = 0;

		if (d->rq_count == 0) {
			free(buf);
			return IBV_WC_RNR_RETRY_EXC_ERR;
		}
		e = &d->rq[d->rq_head];
		if (wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_SEND_WITH_IMM) {
			for (i = 0; i < e->num_sge && off < total; i++) {
				uint64_t n = total - off < e->sge[i].length ? total - off : e->sge[i].length;

				memcpy((void *)(uintptr_t)e->sge[i].addr, buf + off, n);
				off += n;
			}
			if (off < total) {
				free(buf);
				return IBV_WC_REM_INV_REQ_ERR;
			}
		}
		d->rq_head = (d->rq_head + 1) % (int)(d->cap.max_recv_wr + 1);
		d->rq_count--;
		memset(&wc, 0, sizeof(wc));
		wc.wr_id = e->wr_id;
		wc.status = IBV_WC_SUCCESS;
		wc.opcode = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
		wc.byte_len = (uint32_t)total;
		wc.qp_num = d->qp.qp_num;
		wc.src_qp = q->qp.qp_num;
		if (has_imm) {
			wc.imm_data = wr->imm_data; // stays in network byte order
			wc.wc_flags = IBV_WC_WITH_IMM;
		}
		push(d->rcq, &wc, (wr->send_flags & IBV_SEND_SOLICITED) != 0);
	}
	free(buf);
	return IBV_WC_SUCCESS;
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fake_qp *q = (struct fake_qp *)qp;

	pthread_mutex_lock(&mu);
	for (; wr != NULL; wr = wr->next) {
		enum ibv_wc_status st;
		struct ibv_wc wc;
		uint32_t len = 0;
		uint64_t inl = 0;
		int i;

		for (i = 0; i < wr->num_sge; i++)
			inl += wr->sg_list[i].length;
		if ((q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR) ||
		    wr->num_sge > (int)q->cap.max_send_sge ||
		    ((wr->send_flags & IBV_SEND_INLINE) && inl > q->cap.max_inline_data)) {
			*bad = wr;
			pthread_mutex_unlock(&mu);
			return EINVAL;
		}
		st = q->qp.state == IBV_QPS_ERR ? IBV_WC_WR_FLUSH_ERR : execute(q, wr, &len);
		if (st != IBV_WC_SUCCESS && q->qp.state != IBV_QPS_ERR) {
			q->qp.state = IBV_QPS_ERR;
			flush_rq(q);
		}
		if (st == IBV_WC_SUCCESS && !q->sq_sig_all && !(wr->send_flags & IBV_SEND_SIGNALED))
			continue;
		memset(&wc, 0, sizeof(wc));
		wc.wr_id = wr->wr_id;
		wc.status = st;
		wc.qp_num = q->qp.qp_num;
		switch (wr->opcode) {
		case IBV_WR_RDMA_READ:
			wc.opcode = IBV_WC_RDMA_READ;
			wc.byte_len = len;
			break;
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			wc.opcode = IBV_WC_RDMA_WRITE;
			break;
		default:
			wc.opcode = IBV_WC_SEND;
			break;
		}
		// Test hook: report the immediate as the fake decoded it.
		if (st == IBV_WC_SUCCESS &&
		    (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM))
			wc.vendor_err = ntohl(wr->imm_data);
		push(q->scq, &wc, 0);
	}
	pthread_mutex_unlock(&mu);
	return 0;
}

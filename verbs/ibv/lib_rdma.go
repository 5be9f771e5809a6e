//go:build rdma && linux && cgo

package ibv

/*
#cgo CFLAGS: -D_GNU_SOURCE
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "shim.h"

struct rsock_ibv_syms rsock_ibv;

static char rsock_ibv_err[512];

// rsock_ibv_err_passing is set when the last rsock_ibv_load failed for want of file
// descriptors or memory, which may pass: dlerror names the reason only in its text.
static int rsock_ibv_err_passing;

static int rsock_ibv_load_passing(void) { return rsock_ibv_err_passing; }

// rsock_ibv_passing reports whether a dlerror message gives a reason that may pass.
static int rsock_ibv_passing(const char *msg)
{
	static const int codes[] = {EMFILE, ENFILE, ENOMEM};
	size_t i;

	for (i = 0; msg != NULL && i < sizeof(codes) / sizeof(codes[0]); i++)
		if (strstr(msg, strerror(codes[i])) != NULL)
			return 1;
	return 0;
}

// rsock_ibv_sym resolves name at the given symbol version into *slot. With glibc it
// asks for the exact version (the ABI verbs.h describes); a library built without
// symbol versions, or a libc without dlvsym, gets the default version from dlsym.
static int rsock_ibv_sym(void *h, void *slot, const char *name, const char *version)
{
	void *p = NULL;
	const char *msg;

#ifdef __GLIBC__
	p = dlvsym(h, name, version);
#else
	(void)version;
#endif
	if (p == NULL)
		p = dlsym(h, name);
	if (p == NULL) {
		msg = dlerror();
		snprintf(rsock_ibv_err, sizeof(rsock_ibv_err), "dlsym %s: %s", name,
			 msg != NULL ? msg : "not found");
		return -1;
	}
	memcpy(slot, &p, sizeof(p));
	return 0;
}

// rsock_ibv_load opens libibverbs.so.1 and resolves every function this package calls.
// It returns NULL, or a message saying what failed, and sets rsock_ibv_err_passing.
// Called until it succeeds or fails for a reason that cannot pass, one call at a time
// (load in Go).
static const char *rsock_ibv_load(void)
{
	const char *msg;
	void *h;

	rsock_ibv_err_passing = 0;
	h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		msg = dlerror();
		rsock_ibv_err_passing = rsock_ibv_passing(msg);
		snprintf(rsock_ibv_err, sizeof(rsock_ibv_err), "dlopen libibverbs.so.1: %s",
			 msg != NULL ? msg : "unknown error");
		return rsock_ibv_err;
	}
#define SYM(field, name, version) \
	if (rsock_ibv_sym(h, &rsock_ibv.field, name, version) != 0) goto fail
	SYM(get_device_list, "ibv_get_device_list", "IBVERBS_1.1");
	SYM(free_device_list, "ibv_free_device_list", "IBVERBS_1.1");
	SYM(get_device_name, "ibv_get_device_name", "IBVERBS_1.1");
	SYM(open_device, "ibv_open_device", "IBVERBS_1.1");
	SYM(close_device, "ibv_close_device", "IBVERBS_1.1");
	SYM(query_device, "ibv_query_device", "IBVERBS_1.1");
	SYM(query_port, "ibv_query_port", "IBVERBS_1.1");
	SYM(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1");
	SYM(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1");
	SYM(reg_mr, "ibv_reg_mr", "IBVERBS_1.1");
	SYM(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1");
	SYM(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0");
	SYM(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0");
	SYM(create_cq, "ibv_create_cq", "IBVERBS_1.1");
	SYM(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1");
	SYM(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1");
	SYM(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1");
	SYM(create_qp, "ibv_create_qp", "IBVERBS_1.1");
	SYM(modify_qp, "ibv_modify_qp", "IBVERBS_1.1");
	SYM(query_qp, "ibv_query_qp", "IBVERBS_1.1");
	SYM(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1");
	SYM(get_async_event, "ibv_get_async_event", "IBVERBS_1.1");
	SYM(ack_async_event, "ibv_ack_async_event", "IBVERBS_1.1");
#undef SYM
	// Optional: older libraries lack it, and queryPort then reads sysfs.
	if (rsock_ibv_sym(h, &rsock_ibv.query_gid_table, "_ibv_query_gid_table", "IBVERBS_1.11") != 0)
		rsock_ibv.query_gid_table = NULL;
	return NULL;

fail:
	memset(&rsock_ibv, 0, sizeof(rsock_ibv));
	dlclose(h);
	return rsock_ibv_err;
}
*/
import "C"

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"unsafe"

	"github.com/rsockio/rsock/verbs"
)

// Built reports whether this package was compiled with the rdma-core provider
// (build tag rdma, on Linux, with cgo).
const Built = true

// load's state: whether libibverbs is loaded, or the failure to load it, kept when it
// cannot pass.
var (
	loadMu  sync.Mutex
	loaded  bool
	loadErr error
)

// sysfsRoot is where queryPort reads GID tables and describe transports and netdevs;
// tests point it at a fake tree.
var sysfsRoot = DefaultSysfsRoot

// load opens libibverbs once per process. The library stays loaded for the life of
// the process: contexts may be open anywhere, and libibverbs itself dlopens its
// device drivers. A failure is kept too (the library missing, or lacking a function),
// unless it may pass: a process out of file descriptors cannot open the library now,
// and a later call tries again (LibraryError.Temporary).
func load() error {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded || loadErr != nil {
		return loadErr
	}
	if msg := C.rsock_ibv_load(); msg != nil {
		err := &LibraryError{Msg: "ibv: " + C.GoString(msg), Temporary: C.rsock_ibv_load_passing() != 0}
		if !err.Temporary {
			loadErr = err
		}
		return err
	}
	loaded = true
	return nil
}

// Open loads libibverbs.so.1 and returns the rdma-core provider. It fails with a
// *LibraryError when the library or one of its functions is missing, and with an
// error matching verbs.ErrNoDevice when libibverbs finds no device.
func Open() (verbs.Provider, error) {
	if err := load(); err != nil {
		return nil, err
	}
	names, err := deviceNames()
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("ibv: %w: libibverbs lists none", verbs.ErrNoDevice)
	}
	return &provider{inline: make(map[string]int)}, nil
}

// provider implements verbs.Provider over libibverbs.
type provider struct {
	mu     sync.Mutex
	inline map[string]int // device name -> probed max inline data
}

func (p *provider) Name() string { return "ibv" }

// PinsMemory reports that memory registered through this provider is pinned, counted
// against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK. rsock's engine checks it
// before registering, to fall back with a reason instead of the kernel's ENOMEM.
func (p *provider) PinsMemory() bool { return true }

// IsolatesRegionsByQP reports that a peer reaches a registered region only through a
// QP of the region's PD (the device checks the rkey against the responder QP's PD): a
// region whose PD holds no QP is out of every peer's reach. rsock's engine reuses such
// regions for later connections.
func (p *provider) IsolatesRegionsByQP() bool { return true }

// Devices lists every device libibverbs finds, each opened briefly to query it.
func (p *provider) Devices() ([]verbs.DeviceAttr, error) {
	list, n, err := getDeviceList()
	if err != nil {
		return nil, err
	}
	defer C.rsock_free_device_list(list)
	var attrs []verbs.DeviceAttr
	for _, dev := range unsafe.Slice(list, n) {
		name := C.GoString(C.rsock_get_device_name(dev))
		c, err := C.rsock_open_device(dev)
		if c == nil {
			return nil, errnoError("open device "+name, err, classCreate)
		}
		attr, err := p.describe(c, name)
		C.rsock_close_device(c)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, attr)
	}
	return attrs, nil
}

// Open opens the named device.
func (p *provider) Open(device string) (verbs.Context, error) {
	list, n, err := getDeviceList()
	if err != nil {
		return nil, err
	}
	defer C.rsock_free_device_list(list)
	for _, dev := range unsafe.Slice(list, n) {
		if C.GoString(C.rsock_get_device_name(dev)) != device {
			continue
		}
		c, err := C.rsock_open_device(dev)
		if c == nil {
			return nil, errnoError("open device "+device, err, classCreate)
		}
		ctx, err := newContext(p, c, device)
		if err != nil {
			return nil, err // not a nil *devContext in a non-nil verbs.Context
		}
		return ctx, nil
	}
	return nil, fmt.Errorf("ibv: open device %q: %w", device, verbs.ErrNoDevice)
}

// getDeviceList wraps ibv_get_device_list; the caller frees the list.
func getDeviceList() (**C.struct_ibv_device, int, error) {
	var n C.int
	list, err := C.rsock_get_device_list(&n)
	if list == nil {
		if err == nil {
			err = syscall.ENODEV
		}
		if files := filesShort(); files != nil {
			return nil, 0, fmt.Errorf("ibv: %w: ibv_get_device_list: %w (libibverbs said %v)", verbs.ErrNoResources, files, err)
		}
		reason := ""
		if errors.Is(err, syscall.ENOSYS) {
			reason = " (no kernel RDMA support)"
		}
		return nil, 0, fmt.Errorf("ibv: %w: ibv_get_device_list: %w%s", verbs.ErrNoDevice, err, reason)
	}
	if files := filesShort(); files != nil {
		C.rsock_free_device_list(list)
		return nil, 0, fmt.Errorf("ibv: %w: ibv_get_device_list ran with fewer than %d descriptors free and may have left devices out (it listed %d): %w",
			verbs.ErrNoResources, listingFiles, n, files)
	}
	return list, int(n), nil
}

// listingFiles is how many descriptors a device listing may hold at once: libibverbs
// keeps a netlink socket open while it opens a device's sysfs directory and a file in
// it, and the process's other threads may hold one more at that moment.
const listingFiles = 4

// filesShort returns EMFILE or ENFILE when fewer than listingFiles descriptors can be
// opened now, else nil. A process short of descriptors gets a misleading answer from
// libibverbs: with none free, ibv_get_device_list fails with ENOSYS, as if the kernel
// had no RDMA support (Debian 12's rdma-core, in the CI's VM); with too few for its
// scan, it leaves out the devices whose files it could not read, with no error, and
// the list is short or empty. So every listing asks afterwards, and one made short of
// descriptors fails, saying so and matching verbs.ErrNoResources rather than
// verbs.ErrNoDevice: whatever it found, a connection could not have opened the device
// with the descriptors left (a context, a completion channel and their netpoller
// duplicates take four). The descriptors a short listing lacked may have been freed
// by the time it asks: a listing short by one that another thread held at that
// moment still reads as a host without the device.
func filesShort() error {
	var fds [listingFiles]int
	opened := 0
	defer func() {
		for _, fd := range fds[:opened] {
			syscall.Close(fd)
		}
	}()
	for range listingFiles {
		fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			if isOutOfFiles(err) {
				return err
			}
			return nil
		}
		fds[opened] = fd
		opened++
	}
	return nil
}

func deviceNames() ([]string, error) {
	list, n, err := getDeviceList()
	if err != nil {
		return nil, err
	}
	defer C.rsock_free_device_list(list)
	names := make([]string, 0, n)
	for _, dev := range unsafe.Slice(list, n) {
		names = append(names, C.GoString(C.rsock_get_device_name(dev)))
	}
	return names, nil
}

// describe fills a DeviceAttr from ibv_query_device, ibv_query_port for every port,
// the ports' GID tables, a probed max inline size, and from sysfs the device's
// transport (node_type) and each port's netdevs (RoCE GIDs' and IPoIB interfaces).
func (p *provider) describe(c *C.struct_ibv_context, name string) (verbs.DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if rc, err := C.rsock_query_device(c, &a); rc != 0 {
		return verbs.DeviceAttr{}, errnoError("query device "+name, errnoOf(int(rc), err), classOther)
	}
	attr := verbs.DeviceAttr{
		Name: name,
		// ibv_query_device(3): node_guid is in network byte order.
		NodeGUID:  binary.BigEndian.Uint64((*[8]byte)(unsafe.Pointer(&a.node_guid))[:]),
		MaxQP:     int(a.max_qp),
		MaxQPWR:   int(a.max_qp_wr),
		MaxSGE:    int(a.max_sge),
		MaxCQ:     int(a.max_cq),
		MaxCQE:    int(a.max_cqe),
		MaxMR:     int(a.max_mr),
		MaxMRSize: uint64(a.max_mr_size),
		// ibv_create_cq(3): comp_vector is below the context's num_comp_vectors.
		NumCompVectors: max(int(C.rsock_num_comp_vectors(c)), 1),
	}
	for num := 1; num <= int(a.phys_port_cnt); num++ {
		port, err := queryPort(c, name, uint8(num), int(a.phys_port_cnt))
		if err != nil {
			return verbs.DeviceAttr{}, err
		}
		attr.Ports = append(attr.Ports, port)
	}
	attr.MaxInline = p.maxInline(c, name)
	// Transport, Soft-RoCE and netdevs, which the verbs API does not report.
	if err := addSysfsAttrs(sysfsRoot, &attr); err != nil {
		return verbs.DeviceAttr{}, fmt.Errorf("ibv: %w: %w", verbs.ErrNoResources, err)
	}
	return attr, nil
}

// queryPort fills a PortAttr from ibv_query_port and the port's GID table: from
// ibv_query_gid_table where libibverbs and the kernel have it, else from sysfs. nports
// is the device's port count.
func queryPort(c *C.struct_ibv_context, device string, num uint8, nports int) (verbs.PortAttr, error) {
	var pa C.struct_ibv_port_attr
	if rc, err := C.rsock_query_port(c, C.uint8_t(num), &pa); rc != 0 {
		return verbs.PortAttr{}, errnoError(fmt.Sprintf("query port %d of %s", num, device), errnoOf(int(rc), err), classOther)
	}
	port := verbs.PortAttr{
		Num:       num,
		State:     verbs.PortState(pa.state),
		MaxMTU:    verbs.MTU(pa.max_mtu),
		ActiveMTU: verbs.MTU(pa.active_mtu),
		LID:       uint16(pa.lid),
	}
	switch pa.link_layer {
	case C.IBV_LINK_LAYER_INFINIBAND:
		port.LinkLayer = verbs.LinkLayerInfiniBand
	case C.IBV_LINK_LAYER_ETHERNET:
		port.LinkLayer = verbs.LinkLayerEthernet
	default:
		port.LinkLayer = verbs.LinkLayerUnspecified
	}
	gids, ok, err := queryGIDTable(c, num, int(pa.gid_tbl_len)*max(nports, 1), port.LinkLayer)
	if err != nil {
		return verbs.PortAttr{}, fmt.Errorf("ibv: %w: GID table of %s port %d: %w", verbs.ErrNoResources, device, num, err)
	}
	if !ok {
		if gids, err = readPortGIDTable(sysfsRoot, device, num); err != nil {
			if isOutOfFiles(err) {
				return verbs.PortAttr{}, fmt.Errorf("ibv: %w: %w", verbs.ErrNoResources, err)
			}
			return verbs.PortAttr{}, fmt.Errorf("ibv: %w", err)
		}
	}
	port.GIDs = gids
	return port, nil
}

// haveQueryGIDTable reports whether the loaded libibverbs has ibv_query_gid_table.
func haveQueryGIDTable() bool { return C.rsock_ibv.query_gid_table != nil }

// queryGIDTable reads port num's populated GID entries with ibv_query_gid_table, which
// returns the valid entries of every port of the device, with their hardware indices,
// in one call: unlike sysfs, whose table lists every index up to its length (1,024 on
// rxe), populated or not, it costs one system call. room is how many entries of the
// whole device to make room for. ok is false when the call is unavailable (an older
// libibverbs or kernel) or fails (more entries than room): the caller reads sysfs.
// Types and netdevs follow the rules of ReadGIDTable. err is set only when a netdev's
// name cannot be looked up for want of descriptors: an entry without its netdev could
// not be selected by an address with a zone.
func queryGIDTable(c *C.struct_ibv_context, num uint8, room int, link verbs.LinkLayer) (_ []verbs.GIDEntry, ok bool, err error) {
	if room <= 0 {
		return nil, false, nil
	}
	ents := (*C.struct_ibv_gid_entry)(C.calloc(C.size_t(room), C.size_t(unsafe.Sizeof(C.struct_ibv_gid_entry{}))))
	if ents == nil {
		return nil, false, nil
	}
	defer C.free(unsafe.Pointer(ents))
	n := int(C.rsock_query_gid_table(c, ents, C.size_t(room)))
	if n < 0 || n > room {
		return nil, false, nil
	}
	table := []verbs.GIDEntry{} // not nil: a port can have an empty table
	names := map[uint32]string{}
	for _, e := range unsafe.Slice(ents, n) {
		if uint8(e.port_num) != num {
			continue
		}
		ent := verbs.GIDEntry{Index: int(e.gid_index), GID: verbs.GID(*(*[16]byte)(unsafe.Pointer(&e.gid)))}
		if ent.GID.IsZero() {
			continue
		}
		switch e.gid_type {
		case C.IBV_GID_TYPE_ROCE_V2:
			ent.Type = verbs.GIDTypeRoCEv2
		case C.IBV_GID_TYPE_ROCE_V1:
			ent.Type = verbs.GIDTypeRoCEv1
		case C.IBV_GID_TYPE_IB:
			ent.Type = verbs.GIDTypeIB
			if link == verbs.LinkLayerEthernet {
				ent.Type = verbs.GIDTypeRoCEv1
			}
		default:
			continue // a type this package does not know cannot be selected
		}
		if idx := uint32(e.ndev_ifindex); idx != 0 {
			name, seen := names[idx]
			if !seen {
				ifc, err := net.InterfaceByIndex(int(idx))
				if isOutOfFiles(err) {
					return nil, false, fmt.Errorf("netdev %d of GID[%d]: %w", idx, ent.Index, err)
				}
				if err == nil {
					name = ifc.Name
				}
				names[idx] = name
			}
			ent.Netdev = name
		}
		table = append(table, ent)
	}
	slices.SortFunc(table, func(a, b verbs.GIDEntry) int { return cmp.Compare(a.Index, b.Index) })
	return table, true, nil
}

// inlineProbe are the max_inline_data values maxInline tries, largest first.
var inlineProbe = []int{1024, 512, 256, 128, 64, 32}

// maxInline finds the largest inline payload a QP of the device can be created with.
// ibv_query_device does not report it, so a throwaway RC QP (one WR, one SGE) is
// created with decreasing max_inline_data until the device accepts one; the device
// reports the size it granted in the QP's caps. The result is cached per device name;
// 0 means no probe succeeded.
func (p *provider) maxInline(c *C.struct_ibv_context, name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n, ok := p.inline[name]; ok {
		return n
	}
	n := probeInline(c)
	p.inline[name] = n
	return n
}

func probeInline(c *C.struct_ibv_context) int {
	pd := C.rsock_alloc_pd(c)
	if pd == nil {
		return 0
	}
	defer C.rsock_dealloc_pd(pd)
	cq := C.rsock_create_cq(c, 2, nil, 0)
	if cq == nil {
		return 0
	}
	defer C.rsock_destroy_cq(cq)
	for _, want := range inlineProbe {
		var ia C.struct_ibv_qp_init_attr
		ia.send_cq = cq
		ia.recv_cq = cq
		ia.qp_type = C.IBV_QPT_RC
		ia.cap.max_send_wr = 1
		ia.cap.max_recv_wr = 1
		ia.cap.max_send_sge = 1
		ia.cap.max_recv_sge = 1
		ia.cap.max_inline_data = C.uint32_t(want)
		qp := C.rsock_create_qp(pd, &ia)
		if qp == nil {
			continue
		}
		got := int(ia.cap.max_inline_data)
		C.rsock_destroy_qp(qp)
		return got
	}
	return 0
}

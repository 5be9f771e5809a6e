package verbs

import (
	"fmt"
	"net/netip"
)

// AccessFlags are memory and QP access rights (enum ibv_access_flags).
type AccessFlags uint32

const (
	AccessLocalWrite  AccessFlags = 1 << 0 // IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite AccessFlags = 1 << 1 // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead  AccessFlags = 1 << 2 // IBV_ACCESS_REMOTE_READ
)

// QPState is the state of a queue pair (enum ibv_qp_state).
type QPState int

const (
	QPStateReset QPState = iota // IBV_QPS_RESET
	QPStateInit                 // IBV_QPS_INIT
	QPStateRTR                  // IBV_QPS_RTR
	QPStateRTS                  // IBV_QPS_RTS
	QPStateSQD                  // IBV_QPS_SQD
	QPStateSQE                  // IBV_QPS_SQE
	QPStateError                // IBV_QPS_ERR
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERROR"}

func (s QPState) String() string {
	if s >= 0 && int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", int(s))
}

// MTU is a path MTU (enum ibv_mtu): 1 is 256 bytes, up to 5 for 4096 bytes.
type MTU int

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

func (m MTU) String() string { return fmt.Sprintf("%d", m.Bytes()) }

// PortState is the state of a device port (enum ibv_port_state).
type PortState int

const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", int(s))
}

// LinkLayer says what a port runs on.
type LinkLayer int

const (
	LinkLayerUnspecified LinkLayer = iota
	LinkLayerInfiniBand
	LinkLayerEthernet // RoCE
)

// GID is a 128-bit global identifier (union ibv_gid). For RoCE v2 it holds the port's IP
// address (IPv4 as an IPv4-mapped IPv6 address).
type GID [16]byte

// IsZero reports whether the GID is all zeros (an unused table entry).
func (g GID) IsZero() bool { return g == GID{} }

// Addr returns the GID as an IP address, unmapping IPv4-mapped addresses.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// GIDFromAddr returns the RoCE v2 GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// GIDType is the kind of a GID table entry.
type GIDType int

const (
	GIDTypeIB     GIDType = iota // InfiniBand GID
	GIDTypeRoCEv1                // RoCE v1 (IB/RoCE v1 in sysfs)
	GIDTypeRoCEv2                // RoCE v2 (UDP encapsulation)
)

// GIDEntry is one entry of a port's GID table.
type GIDEntry struct {
	Index  int
	GID    GID
	Type   GIDType
	Netdev string // network interface the GID belongs to (RoCE), or ""
}

// DeviceAttr describes a device (a subset of ibv_device_attr plus its ports).
type DeviceAttr struct {
	Name      string
	NodeGUID  uint64
	MaxQP     int    // maximum number of QPs
	MaxQPWR   int    // maximum outstanding WRs on any work queue
	MaxSGE    int    // maximum scatter/gather entries per WR
	MaxCQ     int    // maximum number of CQs
	MaxCQE    int    // maximum entries of one CQ
	MaxMR     int    // maximum number of MRs
	MaxMRSize uint64 // largest registrable region
	MaxInline int    // largest inline payload a QP can be created with
	// Transport is what the device is (its kernel node type): an InfiniBand or RoCE
	// channel adapter, an iWARP RNIC, or something else. See [Transport].
	Transport Transport
	// SoftRoCE says the device is the kernel's Soft-RoCE (rdma_rxe), a RoCE v2 device
	// the host's kernel implements over a netdev, rather than hardware: its
	// completions are made by this host's cores, which a thread spinning on its CQ
	// competes with. Read from sysfs (rxe's parent attribute); false on every other
	// device, verbs/soft's included.
	SoftRoCE bool
	// NumCompVectors is how many completion vectors CreateCQ may name (at least 1).
	NumCompVectors int
	Ports          []PortAttr
}

// PortAttr describes a device port (a subset of ibv_port_attr plus its GID table).
type PortAttr struct {
	Num       uint8
	State     PortState
	MaxMTU    MTU
	ActiveMTU MTU
	LID       uint16
	LinkLayer LinkLayer
	GIDs      []GIDEntry
	// Netdevs are the network interfaces of the port: on RoCE the netdevs its GIDs
	// belong to, on InfiniBand its IPoIB interfaces. The selector ([Selector]) finds
	// an InfiniBand port by the interface that holds the connection's IP.
	Netdevs []string
}

// QPCaps are the capacities of a QP (struct ibv_qp_cap).
type QPCaps struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
}

// QPInitAttr creates a QP (struct ibv_qp_init_attr, RC only).
type QPInitAttr struct {
	SendCQ CQ
	RecvCQ CQ
	Caps   QPCaps
	// SignalAll makes every send WR signaled (sq_sig_all). Otherwise only WRs with
	// SendSignaled produce a completion.
	SignalAll bool
}

// InitAttr is the RESET → INIT transition.
type InitAttr struct {
	Port      uint8
	PKeyIndex uint16
	Access    AccessFlags // remote operations the QP accepts
}

// AddressVector names the peer port (struct ibv_ah_attr).
type AddressVector struct {
	LID       uint16
	Port      uint8 // local port
	IsGlobal  bool  // use GRH: required for RoCE
	DestGID   GID
	SGIDIndex uint8 // local GID table index
	HopLimit  uint8
	// TrafficClass is the GRH traffic class (RoCE v2: the IP header's DSCP and ECN).
	TrafficClass uint8
	// SL is the service level, 0 to 15 (RoCE: mapped to the VLAN priority).
	SL uint8
}

// RTRAttr is the INIT → RTR transition: the peer's identity and the receive side.
type RTRAttr struct {
	PathMTU         MTU
	DestQPN         uint32
	RQPSN           uint32 // the peer's first send PSN
	Dest            AddressVector
	MaxDestRdAtomic uint8 // RDMA READs the peer may have outstanding at us
	MinRNRTimer     uint8 // encoded RNR NAK timer (ibv_modify_qp(3)); 0 means 655.36 ms
}

// RTSAttr is the RTR → RTS transition: the send side.
type RTSAttr struct {
	SQPSN       uint32 // our first send PSN
	Timeout     uint8  // local ACK timeout, 4.096 µs × 2^Timeout; 0 waits forever
	RetryCount  uint8  // transport retries, 0 to 7
	RNRRetry    uint8  // RNR retries, 0 to 7, where 7 retries forever
	MaxRdAtomic uint8  // RDMA READs we may have outstanding
}

// Opcode is a send work request opcode (enum ibv_wr_opcode).
type Opcode int

const (
	OpRDMAWrite        Opcode = 0 // IBV_WR_RDMA_WRITE
	OpRDMAWriteWithImm Opcode = 1 // IBV_WR_RDMA_WRITE_WITH_IMM
	OpSend             Opcode = 2 // IBV_WR_SEND
	OpSendWithImm      Opcode = 3 // IBV_WR_SEND_WITH_IMM
	OpRDMARead         Opcode = 4 // IBV_WR_RDMA_READ
)

func (o Opcode) String() string {
	switch o {
	case OpRDMAWrite:
		return "RDMA_WRITE"
	case OpRDMAWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case OpSend:
		return "SEND"
	case OpSendWithImm:
		return "SEND_WITH_IMM"
	case OpRDMARead:
		return "RDMA_READ"
	}
	return fmt.Sprintf("Opcode(%d)", int(o))
}

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

const (
	SendFence     SendFlags = 1 << 0 // IBV_SEND_FENCE
	SendSignaled  SendFlags = 1 << 1 // IBV_SEND_SIGNALED
	SendSolicited SendFlags = 1 << 2 // IBV_SEND_SOLICITED
	SendInline    SendFlags = 1 << 3 // IBV_SEND_INLINE
)

// SGE is a scatter/gather element (struct ibv_sge): Length bytes at Addr in the MR
// whose local key is LKey. With SendInline, the bytes are copied at post time and
// LKey is not checked.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send-queue work request (struct ibv_send_wr).
type SendWR struct {
	ID     uint64 // returned in the completion as WRID
	Opcode Opcode
	Flags  SendFlags
	SGL    []SGE
	Imm    uint32 // immediate data for the _WITH_IMM opcodes, in host order

	// RemoteAddr and RKey name the peer memory of RDMA READ and WRITE.
	RemoteAddr uint64
	RKey       uint32
}

// RecvWR is a receive-queue work request (struct ibv_recv_wr). An empty SGL is allowed:
// it can take a write-with-imm or a zero-length send.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WCStatus is a completion status (enum ibv_wc_status).
type WCStatus int

const (
	WCSuccess          WCStatus = 0  // IBV_WC_SUCCESS
	WCLocLenErr        WCStatus = 1  // IBV_WC_LOC_LEN_ERR
	WCLocQPOpErr       WCStatus = 2  // IBV_WC_LOC_QP_OP_ERR
	WCLocEECOpErr      WCStatus = 3  // IBV_WC_LOC_EEC_OP_ERR
	WCLocProtErr       WCStatus = 4  // IBV_WC_LOC_PROT_ERR
	WCWRFlushErr       WCStatus = 5  // IBV_WC_WR_FLUSH_ERR
	WCMWBindErr        WCStatus = 6  // IBV_WC_MW_BIND_ERR
	WCBadRespErr       WCStatus = 7  // IBV_WC_BAD_RESP_ERR
	WCLocAccessErr     WCStatus = 8  // IBV_WC_LOC_ACCESS_ERR
	WCRemInvReqErr     WCStatus = 9  // IBV_WC_REM_INV_REQ_ERR
	WCRemAccessErr     WCStatus = 10 // IBV_WC_REM_ACCESS_ERR
	WCRemOpErr         WCStatus = 11 // IBV_WC_REM_OP_ERR
	WCRetryExcErr      WCStatus = 12 // IBV_WC_RETRY_EXC_ERR
	WCRNRRetryExcErr   WCStatus = 13 // IBV_WC_RNR_RETRY_EXC_ERR
	WCLocRDDViolErr    WCStatus = 14 // IBV_WC_LOC_RDD_VIOL_ERR
	WCRemInvRDReqErr   WCStatus = 15 // IBV_WC_REM_INV_RD_REQ_ERR
	WCRemAbortErr      WCStatus = 16 // IBV_WC_REM_ABORT_ERR
	WCInvEECNErr       WCStatus = 17 // IBV_WC_INV_EECN_ERR
	WCInvEECStateErr   WCStatus = 18 // IBV_WC_INV_EEC_STATE_ERR
	WCFatalErr         WCStatus = 19 // IBV_WC_FATAL_ERR
	WCRespTimeoutErr   WCStatus = 20 // IBV_WC_RESP_TIMEOUT_ERR
	WCGeneralErr       WCStatus = 21 // IBV_WC_GENERAL_ERR
	WCTMErr            WCStatus = 22 // IBV_WC_TM_ERR
	WCTMRndvIncomplete WCStatus = 23 // IBV_WC_TM_RNDV_INCOMPLETE
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "work request flushed", "memory window bind error", "bad response",
	"local access error", "remote invalid request", "remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation",
	"remote invalid RD request", "remote aborted", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout", "general error",
	"tag matching error", "tag matching rendezvous incomplete",
}

// String returns the description ibv_wc_status_str gives.
func (s WCStatus) String() string {
	if s >= 0 && int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", int(s))
}

// WCOpcode is a completion opcode (enum ibv_wc_opcode).
type WCOpcode int

const (
	WCSend            WCOpcode = 0   // IBV_WC_SEND
	WCRDMAWrite       WCOpcode = 1   // IBV_WC_RDMA_WRITE
	WCRDMARead        WCOpcode = 2   // IBV_WC_RDMA_READ
	WCRecv            WCOpcode = 128 // IBV_WC_RECV
	WCRecvRDMAWithImm WCOpcode = 129 // IBV_WC_RECV_RDMA_WITH_IMM
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", int(o))
}

// WCFlags qualify a completion (enum ibv_wc_flags).
type WCFlags uint32

const (
	WCWithImm WCFlags = 1 << 1 // IBV_WC_WITH_IMM: Imm is valid
)

// WorkCompletion is one completion (struct ibv_wc). For error statuses only WRID,
// Status, QPN and VendorErr are meaningful, as with ibv.
type WorkCompletion struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32 // bytes received, for receive completions
	Imm       uint32 // immediate data in host order, when Flags has WCWithImm
	QPN       uint32 // the local QP the completion belongs to
	SrcQP     uint32
	Flags     WCFlags
}

// Err returns nil for a successful completion and a *WCError otherwise.
func (wc *WorkCompletion) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, QPN: wc.QPN, WRID: wc.WRID, VendorErr: wc.VendorErr}
}

// WCError is a failed completion as an error.
type WCError struct {
	Status    WCStatus
	QPN       uint32
	WRID      uint64
	VendorErr uint32
}

func (e *WCError) Error() string {
	return fmt.Sprintf("verbs: QP %#x work request %d: %v", e.QPN, e.WRID, e.Status)
}

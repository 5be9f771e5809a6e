package verbstest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rsockio/rsock/verbs"
)

// The agent protocol: a client process drives a verbs provider in an agent process (see
// [ServeAgent] and [DialAgent]) by calls, each answered by one reply, in order, over one
// TCP connection. Both directions use the same frame:
//
//	+----------------+---------------------------------------+
//	| length: uint32 | body: JSON, length bytes (≤ maxFrame) |
//	| big endian     |                                       |
//	+----------------+---------------------------------------+
//
// A call's body is a [call] object, e.g.
//
//	{"op":"regMR","h":3,"n":65536,"access":7}
//
// and its reply a [reply] object, e.g. {"h":4,"addr":...,"lkey":...,"rkey":...}.
// Objects the agent creates (contexts, PDs, CQs, channels, MRs, QPs) are named by handles
// it hands out, never reused within a session. A failed call's reply holds only "err":
// the message, the sentinel error of package verbs it wraps (by name, so that errors.Is
// works across the wire), and for a refused post the index of the refused request.

// maxFrame bounds a frame's body: the largest region the suite moves whole is below 8 MiB,
// which JSON's base64 makes some 11 MiB.
const maxFrame = 32 << 20

// call is one request of the client.
type call struct {
	Op        string            `json:"op"`
	H         uint64            `json:"h,omitempty"`    // the object called
	Name      string            `json:"name,omitempty"` // device to open
	N         int               `json:"n,omitempty"`    // length, CQ entries, port, count
	Off       int               `json:"off,omitempty"`  // offset in a region; completion vector of a new CQ
	Access    verbs.AccessFlags `json:"access,omitempty"`
	SendCQ    uint64            `json:"scq,omitempty"` // CQ handles of a new QP; channel of a new CQ
	RecvCQ    uint64            `json:"rcq,omitempty"`
	Caps      verbs.QPCaps      `json:"caps,omitzero"`
	SignalAll bool              `json:"sigall,omitempty"`
	Solicited bool              `json:"solicited,omitempty"`
	Init      *verbs.InitAttr   `json:"init,omitempty"`
	RTR       *verbs.RTRAttr    `json:"rtr,omitempty"`
	RTS       *verbs.RTSAttr    `json:"rts,omitempty"`
	Send      []verbs.SendWR    `json:"send,omitempty"`
	Recv      []verbs.RecvWR    `json:"recv,omitempty"`
	Data      []byte            `json:"data,omitempty"`
	Timeout   time.Duration     `json:"timeout,omitempty"` // how long a wait may block
}

// reply answers a call.
type reply struct {
	Err      *wireError             `json:"err,omitempty"`
	H        uint64                 `json:"h,omitempty"` // the object created (or the CQ of an event)
	Devices  []verbs.DeviceAttr     `json:"devices,omitempty"`
	Device   *verbs.DeviceAttr      `json:"device,omitempty"`
	Port     *verbs.PortAttr        `json:"port,omitempty"`
	QPN      uint32                 `json:"qpn,omitempty"`
	State    verbs.QPState          `json:"state,omitempty"`
	Caps     *verbs.QPCaps          `json:"caps,omitempty"`
	Capacity int                    `json:"capacity,omitempty"`
	Addr     uint64                 `json:"addr,omitempty"`
	LKey     uint32                 `json:"lkey,omitempty"`
	RKey     uint32                 `json:"rkey,omitempty"`
	Len      int                    `json:"len,omitempty"`
	Access   verbs.AccessFlags      `json:"access,omitempty"`
	WCs      []verbs.WorkCompletion `json:"wcs,omitempty"`
	Data     []byte                 `json:"data,omitempty"`
}

// wireError is an error crossing the wire.
type wireError struct {
	Msg      string `json:"msg"`
	Sentinel string `json:"is,omitempty"`    // name in sentinels
	Index    *int   `json:"index,omitempty"` // a *verbs.PostError's Index
}

// sentinels are the errors callers branch on, by their wire names.
var sentinels = []struct {
	name string
	err  error
}{
	{"no-device", verbs.ErrNoDevice},
	{"not-supported", verbs.ErrNotSupported},
	{"closed", verbs.ErrClosed},
	{"invalid-state", verbs.ErrInvalidState},
	{"invalid-argument", verbs.ErrInvalidArgument},
	{"queue-full", verbs.ErrQueueFull},
	{"no-resources", verbs.ErrNoResources},
	{"cq-overflow", verbs.ErrCQOverflow},
	{"busy", verbs.ErrBusy},
	{"canceled", context.Canceled},
	{"deadline", context.DeadlineExceeded},
}

// encodeError describes err for the wire.
func encodeError(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Msg: err.Error()}
	var pe *verbs.PostError
	if errors.As(err, &pe) {
		w.Msg, w.Index = pe.Err.Error(), &pe.Index
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			w.Sentinel = s.name
			break
		}
	}
	return w
}

// remoteError is an error of the agent, as the client sees it.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return "agent: " + e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// decode returns the error w describes, nil for nil.
func (w *wireError) decode() error {
	if w == nil {
		return nil
	}
	e := &remoteError{msg: w.Msg}
	for _, s := range sentinels {
		if s.name == w.Sentinel {
			e.sentinel = s.err
		}
	}
	if w.Index != nil {
		return &verbs.PostError{Index: *w.Index, Err: e}
	}
	return e
}

// writeFrame writes v as one frame.
func writeFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	if len(body) > maxFrame {
		return fmt.Errorf("encode frame: %d bytes, more than %d", len(body), maxFrame)
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// readFrame reads one frame into v. io.EOF means the stream ended between frames.
func readFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return io.EOF
		}
		return fmt.Errorf("read frame header: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return fmt.Errorf("read frame: length %d, more than %d", n, maxFrame)
	}
	// Read as the bytes come rather than allocating what a header claims.
	body, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err != nil {
		return fmt.Errorf("read frame body: %w", err)
	}
	if len(body) < int(n) {
		return fmt.Errorf("read frame body: %d of %d bytes: %w", len(body), n, io.ErrUnexpectedEOF)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decode frame: %w", err)
	}
	return nil
}

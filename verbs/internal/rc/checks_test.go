package rc

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

var testLimits = Limits{MaxQPWR: 16, MaxSGE: 4, MaxInline: 64, MaxCQE: 32, MaxMTU: verbs.MTU1024, Vectors: 1}

func TestCheckCreateCQ(t *testing.T) {
	tests := []struct {
		cqe, vector int
		ok          bool
	}{
		{1, 0, true},
		{32, 0, true},
		{0, 0, false},
		{33, 0, false},
		{8, 1, false},
		{8, -1, false},
	}
	for _, tt := range tests {
		err := testProvider.CheckCreateCQ(&testLimits, tt.cqe, tt.vector)
		if tt.ok {
			require.NoError(t, err, "CheckCreateCQ(%d, %d)", tt.cqe, tt.vector)
		} else {
			require.ErrorIs(t, err, verbs.ErrInvalidArgument, "CheckCreateCQ(%d, %d)", tt.cqe, tt.vector)
		}
	}
}

func TestCheckQPCaps(t *testing.T) {
	good := verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 0, MaxSendSGE: 4, MaxRecvSGE: 0, MaxInlineData: 64}
	tests := []struct {
		name string
		mod  func(*verbs.QPCaps)
		ok   bool
	}{
		{"at the limits", func(*verbs.QPCaps) {}, true},
		{"no send WR", func(c *verbs.QPCaps) { c.MaxSendWR = 0 }, false},
		{"too many send WRs", func(c *verbs.QPCaps) { c.MaxSendWR = 17 }, false},
		{"too many receive WRs", func(c *verbs.QPCaps) { c.MaxRecvWR = 17 }, false},
		{"negative receive WRs", func(c *verbs.QPCaps) { c.MaxRecvWR = -1 }, false},
		{"too many send SGEs", func(c *verbs.QPCaps) { c.MaxSendSGE = 5 }, false},
		{"too many receive SGEs", func(c *verbs.QPCaps) { c.MaxRecvSGE = 5 }, false},
		{"negative SGEs", func(c *verbs.QPCaps) { c.MaxSendSGE = -1 }, false},
		{"too much inline", func(c *verbs.QPCaps) { c.MaxInlineData = 65 }, false},
	}
	for _, tt := range tests {
		c := good
		tt.mod(&c)
		err := testProvider.CheckQPCaps(&testLimits, c)
		if tt.ok {
			require.NoError(t, err, "%s: CheckQPCaps(%+v)", tt.name, c)
		} else {
			require.ErrorIs(t, err, verbs.ErrInvalidArgument, "%s: CheckQPCaps(%+v)", tt.name, c)
		}
	}
}

func TestCheckTransitions(t *testing.T) {
	rtr := verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: 0x12, RQPSN: 7, MinRNRTimer: 12,
		Dest: verbs.AddressVector{Port: 1, IsGlobal: true}}
	rts := verbs.RTSAttr{SQPSN: 5, Timeout: 14, RetryCount: 7, RNRRetry: 7}
	tests := []struct {
		name string
		err  error
	}{
		{"init", testProvider.CheckInit(1, &verbs.InitAttr{Port: 1, Access: ValidAccess})},
		{"init port 2", testProvider.CheckInit(1, &verbs.InitAttr{Port: 2})},
		{"init P_Key index", testProvider.CheckInit(1, &verbs.InitAttr{Port: 1, PKeyIndex: 1})},
		{"init access", testProvider.CheckInit(1, &verbs.InitAttr{Port: 1, Access: 1 << 5})},
		{"rtr", testProvider.CheckRTR(&testLimits, 1, &rtr)},
		{"rtr MTU over the port's", testProvider.CheckRTR(&testLimits, 1, with(rtr, func(a *verbs.RTRAttr) { a.PathMTU = verbs.MTU2048 }))},
		{"rtr invalid MTU", testProvider.CheckRTR(&testLimits, 1, with(rtr, func(a *verbs.RTRAttr) { a.PathMTU = 0 }))},
		{"rtr QPN", testProvider.CheckRTR(&testLimits, 1, with(rtr, func(a *verbs.RTRAttr) { a.DestQPN = 1 << 24 }))},
		{"rtr PSN", testProvider.CheckRTR(&testLimits, 1, with(rtr, func(a *verbs.RTRAttr) { a.RQPSN = 1 << 24 }))},
		{"rtr not global", testProvider.CheckRTR(&testLimits, 1, with(rtr, func(a *verbs.RTRAttr) { a.Dest.IsGlobal = false }))},
		{"rtr port", testProvider.CheckRTR(&testLimits, 1, with(rtr, func(a *verbs.RTRAttr) { a.Dest.Port = 2 }))},
		{"rtr RNR timer", testProvider.CheckRTR(&testLimits, 1, with(rtr, func(a *verbs.RTRAttr) { a.MinRNRTimer = 32 }))},
		{"rts", testProvider.CheckRTS(1, &rts)},
		{"rts PSN", testProvider.CheckRTS(1, with(rts, func(a *verbs.RTSAttr) { a.SQPSN = 1 << 24 }))},
		{"rts timeout", testProvider.CheckRTS(1, with(rts, func(a *verbs.RTSAttr) { a.Timeout = 32 }))},
		{"rts retry", testProvider.CheckRTS(1, with(rts, func(a *verbs.RTSAttr) { a.RetryCount = 8 }))},
		{"rts RNR retry", testProvider.CheckRTS(1, with(rts, func(a *verbs.RTSAttr) { a.RNRRetry = 8 }))},
	}
	for _, tt := range tests {
		switch tt.name {
		case "init", "rtr", "rts":
			require.NoError(t, tt.err, tt.name)
		default:
			require.ErrorIs(t, tt.err, verbs.ErrInvalidArgument, tt.name)
			require.Contains(t, tt.err.Error(), "test: QP 0x1: to ", tt.name)
		}
	}
}

// with returns a copy of v changed by mod.
func with[T any](v T, mod func(*T)) *T {
	mod(&v)
	return &v
}

func TestTransition(t *testing.T) {
	tests := []struct {
		state    verbs.QPState
		closed   bool
		from, to verbs.QPState
		want     error
		after    verbs.QPState
	}{
		{verbs.QPStateReset, false, verbs.QPStateReset, verbs.QPStateInit, nil, verbs.QPStateInit},
		{verbs.QPStateInit, false, verbs.QPStateReset, verbs.QPStateInit, verbs.ErrInvalidState, verbs.QPStateInit},
		{verbs.QPStateRTR, false, verbs.QPStateRTR, verbs.QPStateRTS, nil, verbs.QPStateRTS},
		{verbs.QPStateRTR, true, verbs.QPStateRTR, verbs.QPStateRTS, verbs.ErrClosed, verbs.QPStateRTR},
	}
	for _, tt := range tests {
		var st atomic.Int32
		st.Store(int32(tt.state))
		err := testProvider.Transition(9, &st, tt.closed, "to X", tt.from, tt.to)
		name := fmt.Sprintf("Transition(%v, closed %v, %v → %v)", tt.state, tt.closed, tt.from, tt.to)
		if tt.want == nil {
			require.NoError(t, err, name)
		} else {
			require.ErrorIs(t, err, tt.want, name)
		}
		require.Equal(t, tt.after, verbs.QPState(st.Load()), "state after "+name)
	}
}

func TestCheckPost(t *testing.T) {
	e := testProvider.PostErrors()
	caps := verbs.QPCaps{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 8}
	sge := verbs.SGE{Length: 8}
	tests := []struct {
		name   string
		st     verbs.QPState
		closed bool
		inUse  uint64
		send   *verbs.SendWR // nil: recv
		recv   *verbs.RecvWR
		want   error
	}{
		{"send", verbs.QPStateRTS, false, 1, &verbs.SendWR{Opcode: verbs.OpSend}, nil, nil},
		{"send in ERROR", verbs.QPStateError, false, 0, &verbs.SendWR{Opcode: verbs.OpSend}, nil, nil},
		{"send closed", verbs.QPStateRTS, true, 0, &verbs.SendWR{Opcode: verbs.OpSend}, nil, e.Closed},
		{"send in RTR", verbs.QPStateRTR, false, 0, &verbs.SendWR{Opcode: verbs.OpSend}, nil, e.SendState},
		{"send opcode", verbs.QPStateRTS, false, 0, &verbs.SendWR{Opcode: verbs.OpRDMARead + 1}, nil, e.Opcode},
		{"send SGEs", verbs.QPStateRTS, false, 0, &verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{sge, sge}}, nil, e.SendSGEs},
		{"send queue full", verbs.QPStateRTS, false, 2, &verbs.SendWR{Opcode: verbs.OpSend}, nil, e.SendQueueFull},
		{"inline", verbs.QPStateRTS, false, 0, &verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendInline, SGL: []verbs.SGE{sge}}, nil, nil},
		{"inline read", verbs.QPStateRTS, false, 0, &verbs.SendWR{Opcode: verbs.OpRDMARead, Flags: verbs.SendInline}, nil, e.InlineOpcode},
		{"inline too large", verbs.QPStateRTS, false, 0, &verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendInline, SGL: []verbs.SGE{{Length: 9}}}, nil, e.InlineTooLarge},
		{"inline, queue full first", verbs.QPStateRTS, false, 2, &verbs.SendWR{Opcode: verbs.OpRDMARead, Flags: verbs.SendInline}, nil, e.SendQueueFull},
		{"recv in INIT", verbs.QPStateInit, false, 1, nil, &verbs.RecvWR{}, nil},
		{"recv in ERROR", verbs.QPStateError, false, 0, nil, &verbs.RecvWR{}, nil},
		{"recv closed", verbs.QPStateInit, true, 0, nil, &verbs.RecvWR{}, e.Closed},
		{"recv in RESET", verbs.QPStateReset, false, 0, nil, &verbs.RecvWR{}, e.RecvState},
		{"recv SGEs", verbs.QPStateRTS, false, 0, nil, &verbs.RecvWR{SGL: []verbs.SGE{sge, sge}}, e.RecvSGEs},
		{"recv queue full", verbs.QPStateRTS, false, 2, nil, &verbs.RecvWR{}, e.RecvQueueFull},
	}
	for _, tt := range tests {
		var err error
		if tt.send != nil {
			// As a provider posts: the queue checks, then an inline WR's own.
			err = e.CheckPostSend(tt.st, tt.closed, &caps, tt.inUse, tt.send)
			if err == nil && tt.send.Flags&verbs.SendInline != 0 {
				err = e.CheckInline(&caps, tt.send.Opcode, tt.send.SGL)
			}
		} else {
			err = e.CheckPostRecv(tt.st, tt.closed, &caps, tt.inUse, tt.recv)
		}
		require.Equal(t, tt.want, err, tt.name)
	}
	allocs := testing.AllocsPerRun(100, func() {
		e.CheckPostSend(verbs.QPStateRTS, false, &caps, 2, &verbs.SendWR{Opcode: verbs.OpSend})
	})
	require.Zero(t, allocs, "allocations of a rejected post's check")
}

func TestToErrorAndFail(t *testing.T) {
	tests := []struct {
		state      verbs.QPState
		closed     bool
		wantErr    error // of ToError
		wantFailed bool  // Fail moved it
	}{
		{verbs.QPStateReset, false, verbs.ErrInvalidState, true},
		{verbs.QPStateInit, false, nil, true},
		{verbs.QPStateRTS, false, nil, true},
		{verbs.QPStateError, false, nil, false},
		{verbs.QPStateRTS, true, verbs.ErrClosed, false},
	}
	for _, tt := range tests {
		var st atomic.Int32
		var closed atomic.Bool
		closed.Store(tt.closed)

		st.Store(int32(tt.state))
		err := testProvider.ToError(3, &st, tt.closed)
		want := verbs.QPStateError
		if tt.wantErr != nil {
			require.ErrorIs(t, err, tt.wantErr, "ToError from %v, closed %v", tt.state, tt.closed)
			want = tt.state
		} else {
			require.NoError(t, err, "ToError from %v", tt.state)
		}
		require.Equal(t, want, verbs.QPState(st.Load()), "state after ToError from %v, closed %v", tt.state, tt.closed)

		st.Store(int32(tt.state))
		require.Equal(t, tt.wantFailed, Fail(&st, &closed), "Fail from %v, closed %v", tt.state, tt.closed)
		want = verbs.QPStateError
		if tt.closed {
			want = tt.state
		}
		require.Equal(t, want, verbs.QPState(st.Load()), "state after Fail from %v, closed %v", tt.state, tt.closed)
	}
}

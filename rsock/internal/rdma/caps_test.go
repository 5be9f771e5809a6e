package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

func TestCheckCaps(t *testing.T) {
	def := Options{}.withDefaults() // 64 send and 64 receive WQEs, 8 KiB ring and 4 KiB staging (growing to 4 MiB and 1 MiB)
	dev := func(qpwr, cqe int, mr uint64) verbs.DeviceAttr {
		return verbs.DeviceAttr{Name: "mlx5_0", MaxQPWR: qpwr, MaxCQE: cqe, MaxMRSize: mr}
	}
	tests := []struct {
		name string
		dev  verbs.DeviceAttr
		opts Options
		want string // "" for no error
	}{
		{"within limits", dev(16384, 1<<22, 1<<34), def, ""},
		{"limits not reported", dev(0, 0, 0), def, ""},
		{"exactly at the limits (the proof WQE included)", dev(65, 129, 8<<10), def, ""},
		{"queue depths", dev(32, 0, 0), def,
			"rdma: beyond the device's limits of mlx5_0: send queue depth 64 > max_qp_wr 32, receive queue depth 65 > max_qp_wr 32"},
		{"receive depth only", dev(100, 0, 0), Options{RecvWQEs: 128}.withDefaults(),
			"rdma: beyond the device's limits of mlx5_0: receive queue depth 129 > max_qp_wr 100"},
		{"CQ entries", dev(0, 100, 0), def,
			"rdma: beyond the device's limits of mlx5_0: 129 completions per connection > max_cqe 100"},
		{"registration size", dev(0, 0, 64<<10), Options{RingSize: 128 << 10}.withDefaults(),
			"rdma: beyond the device's limits of mlx5_0: receive ring of 131072 bytes > max_mr_size 65536"},
		{"send buffer", dev(0, 0, 64<<10), Options{RingSize: 64 << 10, GrowRingTo: -1, SendBufferSize: 128 << 10}.withDefaults(),
			"rdma: beyond the device's limits of mlx5_0: send buffer of 131072 bytes > max_mr_size 65536"},
	}
	for _, tt := range tests {
		err := checkCaps(tt.dev, tt.opts)
		if tt.want == "" {
			if err != nil {
				t.Errorf("%s: checkCaps = %v, want nil", tt.name, err)
			}
			continue
		}
		require.ErrorIs(t, err, ErrDeviceLimit, tt.name)
		if err.Error() != tt.want {
			t.Errorf("%s: checkCaps = %q, want %q", tt.name, err, tt.want)
		}
	}
}

// TestPrepareWithinDeviceLimits prepares endpoints on soft devices with small limits:
// queue depths beyond max_qp_wr are refused before anything is allocated, with the
// figures; the CQ and the inline size are fitted to the device.
func TestPrepareWithinDeviceLimits(t *testing.T) {
	f := soft.New(soft.Options{Limits: soft.Limits{MaxQPWR: 32}})
	_, err := Prepare(f, loopback, Options{})
	require.ErrorIs(t, err, ErrDeviceLimit)
	require.EqualError(t, err, "rdma: beyond the device's limits of soft0: send queue depth 64 > max_qp_wr 32, receive queue depth 65 > max_qp_wr 32")
	requireReleased(t, f)
	require.Zero(t, f.Stats().Contexts, "nothing opened for nobody")

	e, err := Prepare(f, loopback, Options{SendWQEs: 32, RecvWQEs: 31}) // and the proof WQE
	require.NoError(t, err, "depths at the limit")
	require.NoError(t, e.Abort())
	requireReleased(t, f)

	// A CQ larger than max_cqe is fitted to it; inline data to max_inline.
	g := soft.New(soft.Options{Limits: soft.Limits{MaxCQE: 1024, MaxInline: 64}})
	a, b := connPair(t, g, Options{CQSize: 1 << 20})
	require.Equal(t, 1024, a.ep.poller.capacity, "CQ entries")
	require.Equal(t, 64, a.ep.inline, "inline size")
	moveVerified(t, a, b, 64<<10)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireReleased(t, g)
}

// TestPrepareWithinDeviceLimitsOnFake: Prepare on fake devices with limits refuses
// queue depths beyond max_qp_wr with ErrDeviceLimit before it allocates anything, takes
// depths at the limit, and fits the CQ to max_cqe and inline data to max_inline.
func TestPrepareWithinDeviceLimitsOnFake(t *testing.T) {
	limited := func(qpwr, cqe, inline int) verbs.DeviceAttr {
		d := fakeDevice("fake0", loopback)
		d.MaxQPWR, d.MaxCQE, d.MaxInline = qpwr, cqe, inline
		return d
	}
	tests := []struct {
		name       string
		dev        verbs.DeviceAttr
		opts       Options
		wantErr    string
		wantCQE    int
		wantInline int
	}{
		{name: "queues too deep", dev: limited(32, 0, 0), opts: Options{},
			wantErr: "send queue depth 64 > max_qp_wr 32, receive queue depth 65 > max_qp_wr 32"},
		{name: "depths at the limit (the proof WQE included)", dev: limited(32, 0, 0),
			opts: Options{SendWQEs: 32, RecvWQEs: 31}, wantCQE: DefaultCQSize},
		{name: "CQ and inline fitted", dev: limited(0, 1024, 64), opts: Options{CQSize: 1 << 20},
			wantCQE: 1024, wantInline: 64},
		{name: "inline bounded by the engine", dev: limited(0, 0, 4096), opts: Options{},
			wantCQE: DefaultCQSize, wantInline: maxInline},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeProvider(tt.dev)
			ep, err := Prepare(p, loopback, tt.opts)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, ErrDeviceLimit)
				require.ErrorContains(t, err, tt.wantErr)
				live, _, _ := p.counts()
				require.Zero(t, live.PDs+live.MRs+live.QPs+live.CQs, "allocated before the refusal: %+v", live)
				requireFakeReleased(t, p)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantCQE, ep.poller.capacity, "CQ entries")
			require.Equal(t, tt.wantCQE, ep.poller.qpCQ.(*fakeIdleCQ).cqe, "CQ entries asked of the device")
			require.Equal(t, tt.wantInline, ep.inline, "inline size")
			require.Equal(t, tt.wantInline, ep.qp.(*fakeVerbsQP).attr.Caps.MaxInlineData, "inline size of the QP")
			require.NoError(t, ep.Abort())
			requireFakeReleased(t, p)
		})
	}
}

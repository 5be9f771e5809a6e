package auto

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/ibv"
)

// TestDefaultReason checks that Default explains itself on this machine: without the
// rdma tag it is not built in; with it, this test machine has no usable device.
func TestDefaultReason(t *testing.T) {
	p, err := Default()
	if err == nil {
		t.Logf("auto.Default() = %s provider; this machine has an active RDMA port", p.Name())
		return
	}
	require.Nil(t, p, "Default() returned a provider with an error")
	t.Logf("auto.Default(): %v", err)
	if !ibv.Built {
		require.ErrorIs(t, err, ibv.ErrNotBuilt)
		require.EqualError(t, err, "ibv: not built with RDMA support (build with -tags rdma)")
		return
	}
	if !errors.Is(err, verbs.ErrNoDevice) && !errors.Is(err, verbs.ErrNotSupported) {
		t.Errorf("Default() error %q is neither verbs.ErrNoDevice nor verbs.ErrNotSupported", err)
	}
	// The answer is cached: a second call says the same.
	_, err2 := Default()
	require.Equal(t, err.Error(), err2.Error())
}

func TestCache(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name      string
		err       error
		wantCalls []int // probe calls after each get, with the clock advancing between
		advance   time.Duration
	}{
		{"success is kept", nil, []int{1, 1, 1}, time.Hour},
		{"not built is kept", ibv.ErrNotBuilt, []int{1, 1, 1}, time.Hour},
		{"no device is retried after RetryInterval", verbs.ErrNoDevice, []int{1, 2, 3}, RetryInterval},
		{"no device is kept within RetryInterval", verbs.ErrNoDevice, []int{1, 1, 2}, RetryInterval / 2},
		// Listing devices out of file descriptors: the process may have some again soon.
		{"another failure is retried after RetryInterval", fmt.Errorf("ibv: list devices: %w", syscall.EMFILE), []int{1, 2, 3}, RetryInterval},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := now
			calls := 0
			c := &cache{
				probe: func() (verbs.Provider, error) { calls++; return nil, tt.err },
				now:   func() time.Time { return clock },
			}
			for i, want := range tt.wantCalls {
				_, err := c.get()
				require.ErrorIs(t, err, tt.err)
				if calls != want {
					t.Errorf("after get #%d: %d probes, want %d", i+1, calls, want)
				}
				clock = clock.Add(tt.advance)
			}
		})
	}
}

// fakeProvider is a verbs.Provider with fixed devices, for usable.
type fakeProvider struct{ devs []verbs.DeviceAttr }

func (f fakeProvider) Name() string                              { return "fake" }
func (f fakeProvider) Devices() ([]verbs.DeviceAttr, error)      { return f.devs, nil }
func (f fakeProvider) Open(device string) (verbs.Context, error) { return nil, verbs.ErrNotSupported }

func TestUsable(t *testing.T) {
	tests := []struct {
		name    string
		devs    []verbs.DeviceAttr
		wantErr string
	}{
		{"active port", []verbs.DeviceAttr{
			{Name: "d0", Ports: []verbs.PortAttr{{Num: 1, State: verbs.PortDown}}},
			{Name: "d1", Ports: []verbs.PortAttr{{Num: 1, State: verbs.PortActive}}},
		}, ""},
		{"no devices", nil, "fake: no RDMA device"},
		{"all down", []verbs.DeviceAttr{
			{Name: "d0", Ports: []verbs.PortAttr{{Num: 1, State: verbs.PortDown}, {Num: 2, State: verbs.PortInit}}},
			{Name: "d1"},
		}, "fake: no active RDMA port (d0 port 1 is DOWN, d0 port 2 is INIT, d1 has no ports)"},
	}
	for _, tt := range tests {
		p, err := usable(fakeProvider{tt.devs})
		if tt.wantErr == "" {
			require.NoError(t, err, tt.name)
			require.NotNil(t, p, tt.name)
			continue
		}
		require.Nil(t, p, tt.name)
		require.EqualError(t, err, tt.wantErr, tt.name)
		require.ErrorIs(t, err, verbs.ErrNoDevice, tt.name)
	}
}

// TestFresh: fresh reports a cached answer that stands, and never waits for a probe
// under way.
func TestFresh(t *testing.T) {
	clock := time.Unix(1000, 0)
	probing, release := make(chan struct{}), make(chan struct{})
	c := &cache{
		probe: func() (verbs.Provider, error) {
			probing <- struct{}{}
			<-release
			return nil, nil
		},
		now: func() time.Time { return clock },
	}
	require.False(t, c.fresh(), "before the first probe")

	got := make(chan error)
	go func() { _, err := c.get(); got <- err }()
	<-probing
	require.False(t, c.fresh(), "while a probe runs (and without waiting for it)")
	close(release)
	require.NoError(t, <-got)
	require.True(t, c.fresh(), "a provider found is kept")

	// A "no device" answer stands for RetryInterval.
	c = &cache{probe: func() (verbs.Provider, error) { return nil, verbs.ErrNoDevice }, now: func() time.Time { return clock }}
	_, err := c.get()
	require.ErrorIs(t, err, verbs.ErrNoDevice)
	require.True(t, c.fresh(), "within RetryInterval")
	clock = clock.Add(RetryInterval)
	require.False(t, c.fresh(), "once RetryInterval passed")
}

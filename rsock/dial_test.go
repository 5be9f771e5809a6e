package rsock

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// slowProvider is a soft fabric whose device listing blocks until the test releases it:
// a device that takes longer to find than a dial may wait.
type slowProvider struct {
	*soft.Fabric
	entered chan struct{} // receives when a listing has started
	release chan struct{} // closed by the test
}

func newSlowProvider(t *testing.T, fab *soft.Fabric) *slowProvider {
	p := &slowProvider{Fabric: fab, entered: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(p.release) })
	return p
}

func (p *slowProvider) Devices() ([]verbs.DeviceAttr, error) {
	select {
	case p.entered <- struct{}{}:
	default:
	}
	<-p.release
	return p.Fabric.Devices()
}

// TestDialBoundedWhileDeviceIsSlow dials while the client's device listing hangs: the
// dial returns when its context ends, with the context's error, or when the handshake
// timeout runs out, with an error matching os.ErrDeadlineExceeded. It must not wait for
// the device (a dial that did would hang here until the test's own timeout).
func TestDialBoundedWhileDeviceIsSlow(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, _ := rdmaConfigs(t, FallbackTCP, fab)
	ln := listen(t, scfg)
	tests := []struct {
		name    string
		timeout time.Duration // HandshakeTimeout; 0: the default
		ctx     func(p *slowProvider) context.Context
		want    error
	}{
		{
			name: "context cancelled",
			ctx: func(p *slowProvider) context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				go func() {
					<-p.entered
					cancel()
				}()
				return ctx
			},
			want: context.Canceled,
		},
		{
			name: "context deadline",
			ctx: func(*slowProvider) context.Context {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				t.Cleanup(cancel)
				return ctx
			},
			want: context.DeadlineExceeded,
		},
		{
			name:    "handshake timeout",
			timeout: 50 * time.Millisecond,
			ctx:     func(*slowProvider) context.Context { return context.Background() },
			want:    os.ErrDeadlineExceeded,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newSlowProvider(t, fab)
			d := &Dialer{Config: &Config{Provider: p, HandshakeTimeout: tt.timeout}}
			c, err := d.DialContext(tt.ctx(p), "tcp", ln.Addr().String())
			require.ErrorIs(t, err, tt.want, "dial while the device listing hangs")
			require.Nil(t, c)
		})
	}
}

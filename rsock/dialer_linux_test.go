package rsock

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDialerKeepAlive reads the bootstrap socket's keep-alive options: Dialer.KeepAlive
// replaces Config.KeepAlive, and negative turns keep-alive off.
func TestDialerKeepAlive(t *testing.T) {
	ln := listen(t, nil)
	tests := []struct {
		cfg, dialer time.Duration
		on          bool
		idle        int // TCP_KEEPIDLE in seconds, when on
	}{
		{0, 0, true, int(DefaultKeepAlive / time.Second)},
		{20 * time.Second, 0, true, 20},
		{20 * time.Second, 7 * time.Second, true, 7},
		{20 * time.Second, -1, false, 0},
		{-1, 9 * time.Second, true, 9},
	}
	for _, tt := range tests {
		// DisableSHM and DisableRDMA: the connection stays on its TCP bootstrap, whose
		// socket is read.
		d := &Dialer{Config: &Config{KeepAlive: tt.cfg, DisableSHM: true, DisableRDMA: true}, KeepAlive: tt.dialer}
		c, s := dialAccept(t, d, ln)
		raw, err := c.tcp.SyscallConn()
		require.NoError(t, err)
		var on, idle int
		var serr error
		require.NoError(t, raw.Control(func(fd uintptr) {
			on, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE)
			if serr == nil && on != 0 {
				idle, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
			}
		}))
		require.NoError(t, serr)
		require.Equal(t, tt.on, on != 0, "SO_KEEPALIVE with Config.KeepAlive %v, Dialer.KeepAlive %v", tt.cfg, tt.dialer)
		if tt.on {
			require.Equal(t, tt.idle, idle, "TCP_KEEPIDLE with Config.KeepAlive %v, Dialer.KeepAlive %v", tt.cfg, tt.dialer)
		}
		c.Close()
		s.Close()
	}
}

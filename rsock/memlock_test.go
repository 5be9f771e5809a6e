package rsock

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// memlockChildEnv marks the child process TestMemlockFallback runs itself in.
const memlockChildEnv = "RSOCK_TEST_MEMLOCK_CHILD"

// memlockLimit is the RLIMIT_MEMLOCK of the child: `ulimit -l 128`, what a small
// container or an old distribution gives an unprivileged user.
const memlockLimit = 128 << 10

// TestMemlockFallback runs, in a child process of its own with RLIMIT_MEMLOCK lowered
// to 128 KiB and, when started as root, as the unprivileged user nobody (so without
// CAP_IPC_LOCK), connections whose registered memory the limit cannot hold. On a device
// that pins (the default provider, rdma-core, in the Soft-RoCE VM) they fall back to TCP
// with a reason that names RLIMIT_MEMLOCK and its figures: before registering when the
// connection's own memory is over the limit, and from the kernel's ENOMEM when memory
// pinned outside rsock leaves too little. Where there is no default provider, the same
// connections fall back for that reason. On soft, which pins nothing, the limit does not
// apply and the connection uses RDMA. At the defaults, rings that grow, a connection
// fits under the limit on every provider and streams. Every connection echoes both ways.
func TestMemlockFallback(t *testing.T) {
	if os.Getenv(memlockChildEnv) != "1" {
		runMemlockChild(t)
		return
	}
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: memlockLimit, Max: memlockLimit}))
	require.NotZero(t, os.Geteuid(), "still root")

	p, noDefault := defaultProvider()
	t.Run("default provider", func(t *testing.T) {
		scfg, ccfg := configs(t, FallbackTCP)
		// A fixed 128 KiB ring and 64 KiB of staging: one end alone is over the limit
		// (growing rings, the default, start well under it).
		for _, cfg := range []*Config{scfg, ccfg} {
			cfg.RingSize, cfg.GrowRingTo, cfg.SendBufferSize = 128<<10, -1, 64<<10
		}
		ln := listen(t, scfg)
		c, s := pipe(t, ln, ccfg)
		defer c.Close()
		defer s.Close()
		require.Equal(t, TransportTCP, c.Transport())
		if noDefault != nil {
			t.Logf("no default provider here (%v): the fallback is for that", noDefault)
			require.ErrorIs(t, c.FallbackReason(), ErrNoProvider)
		} else {
			why := requireMemlockReason(t, c, s)
			require.ErrorContains(t, why, fmt.Sprintf("over RLIMIT_MEMLOCK of %d; raise it", memlockLimit))
		}
		requireEcho(t, c, s)
	})
	t.Run("default provider, memory pinned outside rsock", func(t *testing.T) {
		scfg, ccfg := configs(t, FallbackTCP)
		// Small enough for rsock's own check, too much for what the kernel has left.
		for _, cfg := range []*Config{scfg, ccfg} {
			cfg.RingSize, cfg.GrowRingTo, cfg.SendBufferSize = 16<<10, -1, 8<<10
		}
		if noDefault == nil {
			release := pinOutside(t, p, memlockLimit-16<<10)
			defer release()
		}
		ln := listen(t, scfg)
		c, s := pipe(t, ln, ccfg)
		defer c.Close()
		defer s.Close()
		require.Equal(t, TransportTCP, c.Transport())
		if noDefault != nil {
			require.ErrorIs(t, c.FallbackReason(), ErrNoProvider)
		} else {
			why := requireMemlockReason(t, c, s)
			require.ErrorIs(t, why, syscall.ENOMEM)
			require.ErrorContains(t, why, fmt.Sprintf("RLIMIT_MEMLOCK %d", memlockLimit))
		}
		requireEcho(t, c, s)
	})
	t.Run("default provider, growing rings at the defaults", func(t *testing.T) {
		// An idle end pins an 8 KiB ring with its mailbox (three pages) and 4 KiB of
		// staging: both ends fit under the limit, and a stream goes through, its rings
		// growing as far as the limit lets them.
		scfg, ccfg := configs(t, FallbackTCP)
		ln := listen(t, scfg)
		c, s := pipe(t, ln, ccfg)
		defer c.Close()
		defer s.Close()
		if noDefault != nil {
			require.ErrorIs(t, c.FallbackReason(), ErrNoProvider)
			requireEcho(t, c, s)
			return
		}
		require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
		requireEcho(t, c, s)
		msg := make([]byte, 1<<20)
		for i := range msg {
			msg[i] = byte(i * 7)
		}
		werr := make(chan error, 1)
		go func() {
			_, err := c.Write(msg)
			werr <- err
		}()
		got := make([]byte, len(msg))
		_, err := io.ReadFull(s, got)
		require.NoError(t, err)
		require.NoError(t, <-werr)
		require.Equal(t, msg, got, "the stream")
	})
	t.Run("soft pins nothing", func(t *testing.T) {
		fab := soft.New(soft.Options{})
		scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
		ln := listen(t, scfg)
		c, s := pipe(t, ln, ccfg)
		require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
		requireEcho(t, c, s)
		c.Close()
		s.Close()
		ln.Close()
		requireReleased(t, fab)
	})
}

// requireMemlockReason checks that the client's connection, or the server's, fell back
// for RLIMIT_MEMLOCK, and returns that side's reason.
func requireMemlockReason(t *testing.T, c, s *Conn) error {
	t.Helper()
	for _, why := range []error{c.FallbackReason(), s.FallbackReason()} {
		var fe *FallbackError
		if errors.As(why, &fe) && !fe.Peer && errors.Is(why, ErrMemlock) {
			require.ErrorIs(t, why, ErrResourcesExhausted)
			t.Logf("reason: %v", why)
			return why
		}
	}
	t.Fatalf("no side fell back for RLIMIT_MEMLOCK: client %v; server %v", c.FallbackReason(), s.FallbackReason())
	return nil
}

// pinOutside registers n bytes on p's first device behind rsock's back, as another
// library of the process might, and returns what releases them.
func pinOutside(t *testing.T, p verbs.Provider, n int) func() {
	devs, err := p.Devices()
	require.NoError(t, err)
	require.NotEmpty(t, devs)
	ctx, err := p.Open(devs[0].Name)
	require.NoError(t, err)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	mr, err := pd.RegMR(n, verbs.AccessLocalWrite)
	require.NoError(t, err, "pinning %d bytes under RLIMIT_MEMLOCK of %d", n, memlockLimit)
	return func() {
		mr.Close()
		pd.Close()
		ctx.Close()
	}
}

// runMemlockChild runs TestMemlockFallback again in a child process, which lowers its
// own RLIMIT_MEMLOCK: that cannot be undone in this process. Run as root, it starts the
// child as the user nobody, from a copy of the test binary that nobody may execute.
// The child must not give up root itself: Go's syscall.Setuid changes each thread's
// credentials separately, and the kernel's uverbs refuses a write() (rxe's doorbell, on
// every post) from a thread whose credentials are not those that opened the device,
// with EACCES.
func runMemlockChild(t *testing.T) {
	args := []string{"-test.run=^TestMemlockFallback$", "-test.v", "-test.count=1"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	bin := os.Args[0]
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		dir := t.TempDir()
		for _, d := range []string{filepath.Dir(dir), dir} {
			require.NoError(t, os.Chmod(d, 0o755))
		}
		bin = filepath.Join(dir, "memlock.test")
		b, err := os.ReadFile(os.Args[0])
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(bin, b, 0o755))
		cred = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), memlockChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	require.NoError(t, err)
	require.True(t, strings.Contains(string(out), "--- PASS: TestMemlockFallback"), "the child ran the test")
}

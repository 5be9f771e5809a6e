package rsock

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rsockio/rsock/internal/testcert"
	"github.com/rsockio/rsock/verbs"
)

func TestMain(m *testing.M) {
	if runSHMEchoIfAsked() { // the server process of TestSHMTwoProcesses (shm_test.go)
		return
	}
	goleak.VerifyTestMain(closingIdleDevices{m})
}

// closingIdleDevices runs the tests, then closes the devices kept open after their last
// connection (on rdma-core, each holds a goroutine) before goleak looks.
type closingIdleDevices struct{ m *testing.M }

func (c closingIdleDevices) Run() int {
	code := c.m.Run()
	if err := CloseIdleDevices(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	return code
}

// transports lists the fallback transports tests run on.
var transports = []Fallback{FallbackTCP, FallbackQUIC}

// configs returns a server and a client Config for fallback f; QUIC gets the test
// certificate. They keep loopback connections off shared memory (shm_test.go tests
// it), so that tests of the fallbacks and the providers see what they test.
func configs(t testing.TB, f Fallback) (server, client *Config) {
	t.Helper()
	server, client = &Config{Fallback: f, DisableSHM: true}, &Config{Fallback: f, DisableSHM: true}
	if f == FallbackQUIC {
		st, ct, err := testcert.Configs()
		require.NoError(t, err)
		server.TLSConfig, client.TLSConfig = st, ct
	}
	return server, client
}

// plainConfigs is configs with RDMA off on both sides: the connection stays on its
// fallback transport even where a default provider has a device (in the VM, rxe on lo).
func plainConfigs(t testing.TB, f Fallback) (server, client *Config) {
	t.Helper()
	server, client = configs(t, f)
	server.DisableRDMA, client.DisableRDMA = true, true
	return server, client
}

// listen starts a Listener on loopback, closed at the end of the test.
func listen(t testing.TB, cfg *Config) *Listener {
	t.Helper()
	ln, err := Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln
}

// pipe dials ln and accepts the connection.
func pipe(t testing.TB, ln *Listener, cfg *Config) (client, server *Conn) {
	t.Helper()
	client, err := Dial("tcp", ln.Addr().String(), cfg)
	require.NoError(t, err)
	server, err = ln.AcceptRsock()
	require.NoError(t, err)
	return client, server
}

// logBuffer collects a Listener's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// fakeProvider is an RDMA provider with no devices. It stands for "a provider is
// configured" while this build has no RDMA engine.
type fakeProvider struct{}

func (fakeProvider) Name() string                         { return "fake" }
func (fakeProvider) Devices() ([]verbs.DeviceAttr, error) { return nil, nil }
func (fakeProvider) Open(string) (verbs.Context, error)   { return nil, verbs.ErrNoDevice }

// dialRaw opens a plain TCP connection to ln.
func dialRaw(t testing.TB, ln *Listener) net.Conn {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// childEnv, in a re-executed test binary's environment, names the test it runs as a
// child process (inChild).
const childEnv = "RSOCK_TEST_CHILD"

// inChild reports whether the test runs in the child process inChild starts for it,
// with env added to the environment: a process of its own, for a test that changes
// what is the process's (a resource limit) or counts what is (its mappings). Outside
// it, inChild runs the test in the child, fails t unless it passed there, and
// reports false.
func inChild(t *testing.T, env ...string) bool {
	t.Helper()
	if os.Getenv(childEnv) == t.Name() {
		return true
	}
	args := []string{"-test.run=^" + t.Name() + "$", "-test.v", "-test.count=1"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), childEnv+"="+t.Name()), env...)
	out, err := cmd.CombinedOutput()
	if testing.Verbose() || err != nil {
		t.Logf("child:\n%s", out)
	}
	require.NotContains(t, string(out), "fatal error", "the child died")
	require.NoError(t, err)
	require.Contains(t, string(out), "--- PASS: "+t.Name(), "the child ran the test")
	return false
}

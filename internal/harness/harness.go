// Package harness runs unmodified net.Conn programs (net/http, grpc-go) over every rsock
// transport in tests.
//
// [Transports] lists the transports; [Transport.Env] makes the server and client
// [rsock.Config] of one, with a fresh software RDMA fabric (verbs/soft) for the RDMA
// transport. [Listen] and [Env.Dialer] wrap rsock's Listener and Dialer so that a test
// can assert which transport carried every connection its program made. [Payload]
// makes large, checkable request and response bodies, [BigBody] says how large.
//
// The package is for tests only: its functions fail the test they are given.
package harness

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rsockio/rsock/internal/testcert"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// Transport is one way rsock carries a connection.
type Transport struct {
	// Name names the subtest.
	Name string
	// Want is what [rsock.Conn.Transport] must report on both ends.
	Want string
	// Fallback is the bootstrap transport.
	Fallback rsock.Fallback
	// RDMA gives both ends one software RDMA fabric, so that connections upgrade.
	RDMA bool
}

// Transports are the transports every end-to-end test runs on: RDMA over the software
// provider (bootstrapped over TCP), RDMA bootstrapped over QUIC (and so carrying TLS by
// default), the TCP fallback and the QUIC fallback.
var Transports = []Transport{
	{Name: "rdma", Want: rsock.TransportRDMA, Fallback: rsock.FallbackTCP, RDMA: true},
	{Name: "rdma+tls", Want: rsock.TransportRDMATLS, Fallback: rsock.FallbackQUIC, RDMA: true},
	{Name: "tcp", Want: rsock.TransportTCP, Fallback: rsock.FallbackTCP},
	{Name: "quic", Want: rsock.TransportQUIC, Fallback: rsock.FallbackQUIC},
}

// ForEachTransport runs f as a subtest on every transport of [Transports], with an Env
// of that transport.
func ForEachTransport(t *testing.T, f func(t *testing.T, env *Env)) {
	for _, tr := range Transports {
		t.Run(tr.Name, func(t *testing.T) { f(t, tr.Env(t)) })
	}
}

// HangGuard bounds every wait of a test. It never decides a result: a test that needs
// it has hung, and fails.
const HangGuard = 2 * time.Minute

// Context returns a context that ends at the test's end or after [HangGuard].
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), HangGuard)
	t.Cleanup(cancel)
	return ctx
}

// Env is one test's configuration of a [Transport].
type Env struct {
	Transport
	// Fabric is the software RDMA fabric both ends use, nil unless Transport.RDMA.
	Fabric *soft.Fabric
	// Server and Client are the two ends' Configs. A test may change them before use.
	Server, Client *rsock.Config

	mu        sync.Mutex
	recorders []*recorder // of the Env's Listeners and Dialers
}

// Env returns server and client Configs for tr. QUIC gets the test certificate; RDMA a
// new soft fabric, and the other transports [NoRDMA], so that they stay on their
// fallback even on a machine with an RDMA device.
//
// When the test ends, after the cleanups it registers later have run, every
// connection accepted by the Env's Listeners or dialed by its Dialers must be closed
// (the Env waits up to [CloseWait] for stragglers, such as a client that notices only
// by reading EOF that its server closed), and every soft RDMA resource released.
func (tr Transport) Env(t testing.TB) *Env {
	t.Helper()
	e := &Env{
		Transport: tr,
		Server:    &rsock.Config{Fallback: tr.Fallback, Provider: NoRDMA{}},
		Client:    &rsock.Config{Fallback: tr.Fallback, Provider: NoRDMA{}},
	}
	if tr.Fallback == rsock.FallbackQUIC {
		st, ct, err := testcert.Configs()
		require.NoError(t, err)
		e.Server.TLSConfig, e.Client.TLSConfig = st, ct
	}
	if tr.RDMA {
		e.Fabric = soft.New(soft.Options{})
		e.Server.Provider, e.Client.Provider = e.Fabric, e.Fabric
	}
	t.Cleanup(func() {
		if t.Failed() {
			return // a failed test may have left anything open; say nothing more
		}
		e.requireClosed(t)
		if e.Fabric != nil {
			// A device stays open for a while after its last connection, unless a
			// Listener's Close cooled its provider: a test that only dials (to a server
			// of its own) would wait that out. The fabric is the test's own, so its
			// devices are idle for good now; closing the other fabrics' idle devices
			// too only makes their next connection prepare its device again.
			require.NoError(t, rsock.CloseIdleDevices())
			RequireReleased(t, e.Fabric)
		}
	})
	return e
}

// CloseWait bounds how long an Env waits, at the end of a test, for its connections to
// be closed. It guards against a hang only: connections normally close at once.
const CloseWait = 30 * time.Second

// requireClosed waits for the dials of e's Dialers to end and for every connection of
// its Listeners and Dialers to be closed.
func (e *Env) requireClosed(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	recs := e.recorders
	e.mu.Unlock()
	timeout := time.NewTimer(CloseWait)
	defer timeout.Stop()
	for _, r := range recs {
		select {
		case <-r.dialsDone():
		case <-timeout.C:
			t.Fatalf("%s: a dial still in progress at the end of the test", r.side)
		}
	}
	for _, r := range recs {
		for _, c := range r.conns() {
			select {
			case <-c.closed:
			case <-timeout.C:
				t.Fatalf("%s connection %s -> %s (%s) still open at the end of the test",
					r.side, c.LocalAddr(), c.RemoteAddr(), c.Transport())
			}
		}
	}
}

func (e *Env) track(r *recorder) {
	e.mu.Lock()
	e.recorders = append(e.recorders, r)
	e.mu.Unlock()
}

// RequireReleased checks that every resource of fab went back to it: each connection
// closed on both ends has torn down its queue pair and memory registrations. A Close
// that races a Read in progress (net/http's and crypto/tls's readers do) leaves the
// release to that Read, which returns at once; so the check waits for the release, up
// to CloseWait, instead of sampling the counts the moment Close returned.
func RequireReleased(t testing.TB, fab *soft.Fabric) {
	t.Helper()
	held := func() int {
		s := fab.Stats()
		return s.QPs + s.MRs + s.CQs + s.PDs + s.Contexts + s.CompChannels
	}
	if !assert.Eventually(t, func() bool { return held() == 0 }, CloseWait, time.Millisecond) {
		t.Fatalf("soft RDMA resources left: %+v", fab.Stats())
	}
}

// Listen starts a recording Listener on a loopback port with the server Config. It is
// closed when the test ends.
func (e *Env) Listen(t testing.TB) *Listener {
	t.Helper()
	l := Listen(t, e.Server)
	e.track(&l.record)
	return l
}

// Dialer returns a recording Dialer with the client Config.
func (e *Env) Dialer() *Dialer {
	return e.DialerWith(e.Client)
}

// DialFunc is the type of net.Dialer.DialContext and http.Transport.DialContext.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// RecordDials returns dial, recording the connections it makes like the Env's
// Dialers do. dial must return *rsock.Conn values, as rsock.Dialer.DialContext does.
func (e *Env) RecordDials(dial DialFunc) DialFunc {
	r := &recorder{side: "client"}
	e.track(r)
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		defer r.dialing()()
		c, err := dial(ctx, network, address)
		if err != nil {
			return nil, err
		}
		rc, ok := c.(*rsock.Conn)
		if !ok {
			c.Close()
			return nil, fmt.Errorf("harness: dialed a %T, not an *rsock.Conn", c)
		}
		return r.add(rc), nil
	}
}

// DialerWith returns a recording Dialer with cfg, whose connections the Env checks at
// the end of the test like its other Dialers'.
func (e *Env) DialerWith(cfg *rsock.Config) *Dialer {
	d := &Dialer{Dialer: rsock.Dialer{Config: cfg}, record: recorder{side: "client"}}
	e.track(&d.record)
	return d
}

// Listen starts a recording Listener on 127.0.0.1 with cfg. It is closed when the test
// ends.
func Listen(t testing.TB, cfg *rsock.Config) *Listener {
	t.Helper()
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	l := &Listener{Listener: ln, closed: make(chan struct{}), record: recorder{side: "server"}}
	t.Cleanup(func() { l.Close() })
	return l
}

// Listener is an [rsock.Listener] that records the connections it accepts and
// reports when it is closed. Servers take it as a net.Listener.
type Listener struct {
	*rsock.Listener

	once   sync.Once
	closed chan struct{}
	record recorder
}

// Accept accepts the next connection and records it.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptRsock()
	if err != nil {
		return nil, err
	}
	return l.record.add(c), nil
}

// Close closes the Listener. The first call also closes the channel of [Listener.Closed].
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Closed is closed when the Listener's Close is first called: when a server that owns
// it (http.Server.Shutdown, grpc.Server.GracefulStop, ...) begins to stop.
func (l *Listener) Closed() <-chan struct{} { return l.closed }

// Conns returns the connections accepted so far.
func (l *Listener) Conns() []*Conn { return l.record.conns() }

// URL returns "http://" and the Listener's address.
func (l *Listener) URL() string { return "http://" + l.Addr().String() }

// Dialer is an [rsock.Dialer] that records the connections it dials. Its DialContext
// fits http.Transport.DialContext and its DialAddr grpc.WithContextDialer.
type Dialer struct {
	rsock.Dialer

	record recorder
}

// DialContext dials address and records the connection.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	defer d.record.dialing()()
	c, err := d.DialRsock(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return d.record.add(c), nil
}

// DialAddr is DialContext on network "tcp".
func (d *Dialer) DialAddr(ctx context.Context, address string) (net.Conn, error) {
	return d.DialContext(ctx, "tcp", address)
}

// Conns returns the connections dialed so far.
func (d *Dialer) Conns() []*Conn { return d.record.conns() }

// Conn is an [rsock.Conn] recorded by a Listener or a Dialer. It is the rsock
// connection itself, with all its methods, and knows whether it was closed.
type Conn struct {
	*rsock.Conn

	once   sync.Once
	closed chan struct{}
}

// Close closes the connection and marks it closed.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// Closed is closed when the connection's Close has first returned.
func (c *Conn) Closed() <-chan struct{} { return c.closed }

// NetConn returns the *rsock.Conn it records, as crypto/tls.Conn's NetConn does:
// rsockhttp.Conn looks through wrappers that have it.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// recorder keeps a list of connections, safe for concurrent use.
type recorder struct {
	side string // "server" or "client"

	mu sync.Mutex
	cs []*Conn
	// dials counts the dials in progress. A client may go on dialing after the
	// request that wanted the connection was served by another (http.Transport does), so
	// a connection may still appear, or a failed dial still be releasing its
	// resources, when the test body has returned.
	dials   int
	noDials chan struct{} // closed when dials drops to zero; nil if nobody waits
}

// dialing counts a dial in progress; call the function it returns when the dial ends.
func (r *recorder) dialing() (done func()) {
	r.mu.Lock()
	r.dials++
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.dials--; r.dials == 0 && r.noDials != nil {
			close(r.noDials)
			r.noDials = nil
		}
	}
}

// dialsDone returns a channel closed once no dial of r is in progress.
func (r *recorder) dialsDone() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dials == 0 {
		done := make(chan struct{})
		close(done)
		return done
	}
	if r.noDials == nil {
		r.noDials = make(chan struct{})
	}
	return r.noDials
}

func (r *recorder) add(rc *rsock.Conn) *Conn {
	c := &Conn{Conn: rc, closed: make(chan struct{})}
	r.mu.Lock()
	r.cs = append(r.cs, c)
	r.mu.Unlock()
	return c
}

func (r *recorder) conns() []*Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Conn(nil), r.cs...)
}

// RequireTransport checks that conns holds between 1 and max connections (max < 1: no
// upper bound) and that every one of them is carried by want. what names the side in
// failure messages.
func RequireTransport(t testing.TB, want string, conns []*Conn, max int, what string) {
	t.Helper()
	require.NotEmpty(t, conns, "%s: no connection recorded", what)
	if max > 0 {
		require.LessOrEqual(t, len(conns), max, "%s: %d connections, want at most %d", what, len(conns), max)
	}
	for i, c := range conns {
		require.Equal(t, want, c.Transport(), "%s: connection %d of %d (%s) transport; fallback reason: %v",
			what, i, len(conns), c.RemoteAddr(), c.FallbackReason())
	}
}

// NoRDMA is an RDMA provider without devices. A Config with it stays on its fallback
// transport (the reason matches rsock.ErrNoDevice) whatever hardware the machine has,
// where a nil Provider would use a device if the build and machine have one.
type NoRDMA struct{}

// Name returns "none".
func (NoRDMA) Name() string { return "none" }

// Devices returns no devices.
func (NoRDMA) Devices() ([]verbs.DeviceAttr, error) { return nil, nil }

// Open fails with verbs.ErrNoDevice.
func (NoRDMA) Open(string) (verbs.Context, error) { return nil, verbs.ErrNoDevice }

// Payload returns a reader of n pseudo-random bytes determined by seed: fast to make,
// incompressible, and different at every offset, so that a transfer that loses,
// duplicates or reorders bytes changes their hash.
func Payload(seed uint64, n int64) io.Reader {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	return io.LimitReader(rand.NewChaCha8(key), n)
}

// VerifyTestMain runs a package's tests, as a TestMain does, closes the RDMA devices
// rsock keeps open after their last connection ([rsock.CloseIdleDevices]), and then
// fails the tests if a goroutine outlives them.
func VerifyTestMain(m *testing.M) { goleak.VerifyTestMain(closingIdleDevices{m}) }

// closingIdleDevices runs the tests, then closes idle devices before goleak looks.
type closingIdleDevices struct{ m *testing.M }

func (c closingIdleDevices) Run() int {
	code := c.m.Run()
	if err := rsock.CloseIdleDevices(); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	return code
}

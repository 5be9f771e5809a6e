package workload

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/rsockio/rsock/fallback"
	"github.com/rsockio/rsock/internal/testcert"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// Transport names, as benchmark names and rsockperf's tables spell them.
const (
	SoftVerbs = "SoftVerbs"
	// SoftVerbs3Copy is SoftVerbs with the two parties and the copies of a socket
	// (softverbs.go).
	SoftVerbs3Copy = "SoftVerbs3Copy"
	RsockRDMA      = "RsockRDMA"
	RawTCP         = "RawTCP"
	RsockTCP       = "RsockTCP"
	RawQUIC        = "RawQUIC"
	RsockQUIC      = "RsockQUIC"
	Unix           = "Unix"
	RsockSHM       = "RsockSHM"
	Pipe           = "Pipe"
)

// RsockRDMATLS is rsock upgraded to RDMA from a QUIC bootstrap: TLS 1.3 over the RDMA
// stream, rsock's default when the bootstrap is encrypted.
const RsockRDMATLS = "RsockRDMATLS"

// Transport is one way of carrying a byte stream that the benchmarks compare.
type Transport struct {
	Name string
	// Kind groups transports: "rdma", "tcp", "quic" or "ref" (unix socket, net.Pipe).
	Kind string
	// Baseline names the transport this one is judged against, "" for a baseline.
	Baseline string
	// Desc says what the transport is, for tables and help texts.
	Desc string
	// Raw transports have no net.Conn: only the stream and pingpong workloads run on
	// them, with verbs of their own.
	Raw bool
	// LocalOnly transports cannot span two processes.
	LocalOnly bool
}

var transports = []Transport{
	{Name: SoftVerbs, Kind: "rdma", Raw: true, LocalOnly: true,
		Desc: "raw verbs/soft RDMA_WRITE_WITH_IMM into a ring, one goroutine driving both QPs: the ceiling of RDMA over soft"},
	{Name: SoftVerbs3Copy, Kind: "rdma", Raw: true, LocalOnly: true, Baseline: SoftVerbs,
		Desc: "SoftVerbs with a socket's two parties (the reader, or the echo, on a goroutine of its own) and its three copies (application buffer into registered staging, staging into the ring by the provider, ring into the reader's buffer): the ceiling of a copying socket over soft"},
	{Name: RsockRDMA, Kind: "rdma", Baseline: SoftVerbs3Copy,
		Desc: "rsock.Conn upgraded to RDMA (verbs/soft in one process)"},
	{Name: RsockRDMATLS, Kind: "rdma", Baseline: RsockRDMA,
		Desc: "rsock.Conn upgraded to RDMA from a QUIC bootstrap: TLS 1.3 over the RDMA stream (verbs/soft in one process)"},
	{Name: RawTCP, Kind: "tcp", Desc: "*net.TCPConn on loopback"},
	{Name: RsockTCP, Kind: "tcp", Baseline: RawTCP, Desc: "rsock.Conn on its TCP fallback"},
	{Name: RawQUIC, Kind: "quic", Desc: "one quic-go stream per QUIC connection"},
	{Name: RsockQUIC, Kind: "quic", Baseline: RawQUIC, Desc: "rsock.Conn on its QUIC fallback"},
	{Name: Unix, Kind: "ref", Baseline: RawTCP, Desc: "*net.UnixConn (reference)"},
	{Name: RsockSHM, Kind: "shm", Baseline: Unix,
		Desc: "rsock.Conn upgraded to shared memory between two processes of one host (verbs/shm)"},
	{Name: Pipe, Kind: "ref", Baseline: RawTCP, LocalOnly: true,
		Desc: "net.Pipe, synchronous and in memory (reference)"},
}

// Transports returns every transport, in the order tables list them.
func Transports() []Transport { return append([]Transport(nil), transports...) }

// Lookup returns the transport named name, ignoring case.
func Lookup(name string) (Transport, bool) {
	for _, t := range transports {
		if strings.EqualFold(t.Name, name) {
			return t, true
		}
	}
	return Transport{}, false
}

// Options tune the transports. The zero value gives each its defaults.
type Options struct {
	// Provider is RsockRDMA's RDMA provider. Nil means a fresh verbs/soft fabric when
	// both sides run in one process ([Start]), and rsock's default provider otherwise.
	Provider verbs.Provider
	// RingSize, SendBufferSize, RecvWQEs and PollSpin set the rsock.Config fields of
	// the same names for RsockRDMA; zero keeps rsock's defaults.
	RingSize, SendBufferSize, RecvWQEs, PollSpin int
	// NoDirectPlacement sets rsock.Config.NoDirectPlacement for RsockRDMA, so that a
	// run can set direct placement against the copies it saves.
	NoDirectPlacement bool
	// InsecureTLS makes QUIC clients accept any server certificate. Two processes need
	// it: each generates its own test certificate.
	InsecureTLS bool
}

// Env is a transport ready for workloads: a way to open connections to a [Server],
// and the Server itself when it runs in this process.
type Env struct {
	Transport Transport
	// Addr is the server's address.
	Addr string

	dial    func(ctx context.Context) (net.Conn, error)
	server  *Server
	fabric  *soft.Fabric // SoftVerbs, and RsockRDMA in one process
	regs    *regCounter  // RsockRDMA: memory registered through its provider
	closers []func() error
}

// Start runs t's server side on loopback and returns an Env whose connections reach it,
// all in this process.
func Start(t Transport, o Options) (*Env, error) {
	if t.Raw {
		return &Env{Transport: t, fabric: soft.New(soft.Options{Devices: 2})}, nil
	}
	if o.Provider == nil && (t.Name == RsockRDMA || t.Name == RsockRDMATLS) {
		o.Provider = soft.New(soft.Options{})
	}
	env := &Env{Transport: t}
	s, err := newSides(t, o)
	if err != nil {
		return nil, err
	}
	env.regs = s.regs
	env.fabric, _ = o.Provider.(*soft.Fabric)
	addr := "127.0.0.1:0"
	if t.Name == Unix {
		dir, err := os.MkdirTemp("", "rsockperf")
		if err != nil {
			return nil, err
		}
		env.closers = append(env.closers, func() error { return os.RemoveAll(dir) })
		addr = filepath.Join(dir, "s")
	}
	ln, err := s.listen(addr)
	if err != nil {
		env.Close()
		return nil, fmt.Errorf("%s: listen: %w", t.Name, err)
	}
	env.server = Serve(ln)
	env.Addr = ln.Addr().String()
	env.dial = func(ctx context.Context) (net.Conn, error) { return s.dial(ctx, env.Addr) }
	return env, nil
}

// Listen runs t's server side on addr, for clients in other processes ([Connect]).
func Listen(t Transport, addr string, o Options) (*Server, error) {
	if t.LocalOnly {
		return nil, fmt.Errorf("%s runs in one process only", t.Name)
	}
	s, err := newSides(t, o)
	if err != nil {
		return nil, err
	}
	ln, err := s.listen(addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen: %w", t.Name, err)
	}
	return Serve(ln), nil
}

// Connect returns an Env whose connections reach a Server of t at addr, typically in
// another process.
func Connect(t Transport, addr string, o Options) (*Env, error) {
	if t.LocalOnly {
		return nil, fmt.Errorf("%s runs in one process only", t.Name)
	}
	s, err := newSides(t, o)
	if err != nil {
		return nil, err
	}
	return &Env{
		Transport: t, Addr: addr, regs: s.regs,
		dial: func(ctx context.Context) (net.Conn, error) { return s.dial(ctx, addr) },
	}, nil
}

// Close closes the server (if it runs here) and releases the transport. Connections
// the workloads opened are theirs to close.
func (e *Env) Close() error {
	var errs []error
	if e.server != nil {
		errs = append(errs, e.server.Close())
	}
	for i := len(e.closers) - 1; i >= 0; i-- {
		errs = append(errs, e.closers[i]())
	}
	return errors.Join(errs...)
}

// Server returns the server running in this process, or nil.
func (e *Env) Server() *Server { return e.server }

// Fabric returns the soft fabric of SoftVerbs, or of RsockRDMA in one process, or nil.
func (e *Env) Fabric() *soft.Fabric { return e.fabric }

// RegisteredBytes returns how many bytes of memory are registered now through
// RsockRDMA's provider (both sides, in one process), and whether the transport counts
// them.
func (e *Env) RegisteredBytes() (int64, bool) {
	if e.regs == nil {
		return 0, false
	}
	return e.regs.bytes.Load(), true
}

// open dials a connection to the server and sends the preamble asking for role.
func (e *Env) open(ctx context.Context, role byte, param int) (net.Conn, error) {
	if e.dial == nil {
		return nil, fmt.Errorf("%s carries no net.Conn", e.Transport.Name)
	}
	c, err := e.dial(ctx)
	if err != nil {
		return nil, err
	}
	var pre [preambleLen]byte
	pre[0] = role
	binary.BigEndian.PutUint32(pre[1:], uint32(param))
	if _, err := c.Write(pre[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("send preamble: %w", err)
	}
	return c, nil
}

// sides are a transport's two halves: how to listen and how to dial.
type sides struct {
	listen func(addr string) (net.Listener, error)
	dial   func(ctx context.Context, addr string) (net.Conn, error)
	regs   *regCounter
}

func newSides(t Transport, o Options) (*sides, error) {
	s := &sides{}
	switch t.Name {
	case RawTCP:
		s.listen = func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
		s.dial = func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
	case Unix:
		s.listen = func(addr string) (net.Listener, error) { return net.Listen("unix", addr) }
		s.dial = func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			for tries := 0; ; tries++ {
				c, err := d.DialContext(ctx, "unix", addr)
				// A unix socket's connect fails with EAGAIN, where TCP's would wait,
				// while the listener's backlog is full.
				if err == nil || !errors.Is(err, syscall.EAGAIN) || tries == 1000 {
					return c, err
				}
				time.Sleep(time.Millisecond)
			}
		}
	case Pipe:
		var ln *pipeListener
		s.listen = func(string) (net.Listener, error) {
			ln = newPipeListener()
			return ln, nil
		}
		s.dial = func(ctx context.Context, _ string) (net.Conn, error) { return ln.dial(ctx) }
	case RawQUIC:
		st, ct, err := tlsConfigs(o)
		if err != nil {
			return nil, err
		}
		st.NextProtos, ct.NextProtos = []string{fallback.NextProto}, []string{fallback.NextProto}
		s.listen = func(addr string) (net.Listener, error) { return listenQUIC(addr, st) }
		s.dial = func(ctx context.Context, addr string) (net.Conn, error) { return dialQUIC(ctx, addr, ct) }
	case RsockTCP, RsockQUIC, RsockRDMA, RsockRDMATLS, RsockSHM:
		scfg, ccfg := &rsock.Config{}, &rsock.Config{}
		want := rsock.TransportTCP
		if t.Name == RsockRDMATLS {
			st, ct, err := tlsConfigs(o)
			if err != nil {
				return nil, err
			}
			scfg.Fallback, ccfg.Fallback = rsock.FallbackQUIC, rsock.FallbackQUIC
			scfg.TLSConfig, ccfg.TLSConfig = st, ct
		}
		switch t.Name {
		case RsockQUIC:
			want = rsock.TransportQUIC
			st, ct, err := tlsConfigs(o)
			if err != nil {
				return nil, err
			}
			scfg.Fallback, ccfg.Fallback = rsock.FallbackQUIC, rsock.FallbackQUIC
			scfg.TLSConfig, ccfg.TLSConfig = st, ct
			fallthrough
		case RsockTCP:
			// A provider without devices keeps the connections on their fallback, even
			// in a build whose default provider would find a device.
			scfg.Provider, ccfg.Provider = noDevices{}, noDevices{}
		case RsockSHM: // the default Config, on loopback
			want = rsock.TransportSHM
			for _, c := range []*rsock.Config{scfg, ccfg} {
				c.RingSize, c.SendBufferSize, c.RecvWQEs, c.PollSpin = o.RingSize, o.SendBufferSize, o.RecvWQEs, o.PollSpin
			}
		case RsockRDMA, RsockRDMATLS:
			want = rsock.TransportRDMA
			if t.Name == RsockRDMATLS {
				want = rsock.TransportRDMATLS
			}
			if o.Provider != nil {
				s.regs = &regCounter{}
				p := countRegistered(o.Provider, s.regs)
				scfg.Provider, ccfg.Provider = p, p
			}
			for _, c := range []*rsock.Config{scfg, ccfg} {
				c.RingSize, c.SendBufferSize, c.RecvWQEs, c.PollSpin = o.RingSize, o.SendBufferSize, o.RecvWQEs, o.PollSpin
				c.NoDirectPlacement = o.NoDirectPlacement
			}
		}
		s.listen = func(addr string) (net.Listener, error) { return rsock.Listen("tcp", addr, scfg) }
		d := &rsock.Dialer{Config: ccfg}
		s.dial = func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := d.DialRsock(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			if got := c.Transport(); got != want {
				c.Close()
				return nil, fmt.Errorf("%s: connection runs on %s, not %s: %v", t.Name, got, want, c.FallbackReason())
			}
			return c, nil
		}
	default:
		return nil, fmt.Errorf("transport %s carries no net.Conn", t.Name)
	}
	return s, nil
}

// tlsConfigs returns the test certificate's server and client TLS configurations.
func tlsConfigs(o Options) (server, client *tls.Config, err error) {
	server, client, err = testcert.Configs()
	if err != nil {
		return nil, nil, err
	}
	client.InsecureSkipVerify = o.InsecureTLS
	return server, client, nil
}

// noDevices is an RDMA provider without devices.
type noDevices struct{}

func (noDevices) Name() string                            { return "none" }
func (noDevices) Devices() ([]verbs.DeviceAttr, error)    { return nil, nil }
func (noDevices) Open(name string) (verbs.Context, error) { return nil, verbs.ErrNoDevice }

// closeWriter is a connection that can half-close: every transport's.
type closeWriter interface {
	CloseWrite() error
}

// listenQUIC listens for raw QUIC connections and accepts one stream on each.
func listenQUIC(addr string, tlsConf *tls.Config) (net.Listener, error) {
	ln, err := quic.ListenAddr(addr, tlsConf, nil)
	if err != nil {
		return nil, err
	}
	q := &quicListener{ln: ln, conns: make(chan net.Conn), done: make(chan struct{})}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	go q.acceptLoop()
	return q, nil
}

// dialQUIC dials a raw QUIC connection and opens its stream. The server sees the stream
// with its first byte: the preamble.
func dialQUIC(ctx context.Context, addr string, tlsConf *tls.Config) (net.Conn, error) {
	qc, err := quic.DialAddr(ctx, addr, tlsConf, nil)
	if err != nil {
		return nil, err
	}
	str, err := qc.OpenStreamSync(ctx)
	if err != nil {
		qc.CloseWithError(1, "")
		return nil, err
	}
	return &quicConn{Stream: str, qc: qc}, nil
}

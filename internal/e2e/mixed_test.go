package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/internal/echosvc"
	"github.com/rsockio/rsock/internal/harness"
	"github.com/rsockio/rsock/rsock"
)

// mixedEnv returns an Env whose server offers everything at once: RDMA (soft), TCP and
// QUIC, and plain clients. Its client Config is that of an RDMA client bootstrapping
// over QUIC.
func mixedEnv(t *testing.T) *harness.Env {
	env := harness.Transport{Name: "mixed", Fallback: rsock.FallbackQUIC, RDMA: true}.Env(t)
	env.Server.AcceptPlainClients = true
	return env
}

// clientKind is one kind of client of a mixed server.
type clientKind struct {
	name string
	cfg  func(env *harness.Env) *rsock.Config // nil: a plain client, not using rsock
	want string                               // the transport of its connections
}

var clientKinds = []clientKind{
	{"rdma-over-tcp", func(env *harness.Env) *rsock.Config { return &rsock.Config{Provider: env.Fabric} }, rsock.TransportRDMA},
	{"rdma-over-quic", func(env *harness.Env) *rsock.Config { return env.Client }, rsock.TransportRDMATLS},
	{"tcp", func(env *harness.Env) *rsock.Config { return &rsock.Config{Provider: harness.NoRDMA{}} }, rsock.TransportTCP},
	{"quic", func(env *harness.Env) *rsock.Config {
		return &rsock.Config{Provider: harness.NoRDMA{}, Fallback: rsock.FallbackQUIC, TLSConfig: env.Client.TLSConfig}
	}, rsock.TransportQUIC},
	{"plain", nil, rsock.TransportTCP},
}

// plainDialer dials plain TCP and records the connections' local addresses.
type plainDialer struct {
	net.Dialer
	mu    sync.Mutex
	addrs []net.Addr
}

func (d *plainDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.Dialer.DialContext(ctx, network, address)
	if err == nil {
		d.mu.Lock()
		d.addrs = append(d.addrs, c.LocalAddr())
		d.mu.Unlock()
	}
	return c, err
}

func (d *plainDialer) DialAddr(ctx context.Context, address string) (net.Conn, error) {
	return d.DialContext(ctx, "tcp", address)
}

// dialer makes the dial function of kind: a recording rsock Dialer, or a plainDialer.
// local returns the local addresses of the connections it made so far.
func (k clientKind) dialer(env *harness.Env) (dial func(ctx context.Context, network, address string) (net.Conn, error), local func() []net.Addr) {
	if k.cfg == nil {
		pd := new(plainDialer)
		return pd.DialContext, func() []net.Addr {
			pd.mu.Lock()
			defer pd.mu.Unlock()
			return append([]net.Addr(nil), pd.addrs...)
		}
	}
	d := env.DialerWith(k.cfg(env))
	return d.DialContext, func() []net.Addr {
		var addrs []net.Addr
		for _, c := range d.Conns() {
			addrs = append(addrs, c.LocalAddr())
		}
		return addrs
	}
}

// addrKey identifies one end of a connection by network and port: a client bound to an
// unspecified address reports it so, while the server sees its loopback address.
func addrKey(a net.Addr) string {
	_, port, _ := net.SplitHostPort(a.String())
	return a.Network() + "/" + port
}

// requireServerTransports checks, for each kind of client, that the server accepted
// its connections on the transport the kind should get, and plain clients as plain.
func requireServerTransports(t *testing.T, ln *harness.Listener, local map[string]func() []net.Addr) {
	t.Helper()
	byAddr := make(map[string]*harness.Conn)
	for _, c := range ln.Conns() {
		byAddr[addrKey(c.RemoteAddr())] = c
	}
	for _, k := range clientKinds {
		addrs := local[k.name]()
		require.NotEmpty(t, addrs, "%s: no connection", k.name)
		for _, a := range addrs {
			c, ok := byAddr[addrKey(a)]
			require.True(t, ok, "%s: the server has no connection from %s", k.name, a)
			require.Equal(t, k.want, c.Transport(), "%s: the server's connection from %s; fallback reason: %v", k.name, a, c.FallbackReason())
			require.Equal(t, k.cfg == nil, errors.Is(c.FallbackReason(), rsock.ErrPlainClient), "%s: plain client? reason %v", k.name, c.FallbackReason())
		}
	}
}

// TestMixedClientsGRPC serves one grpc.Server, on one Listener, to every kind of client
// at once; each gets its own transport, on both ends.
func TestMixedClientsGRPC(t *testing.T) {
	env := mixedEnv(t)
	s := serveGRPC(t, env, echosvc.Service{})
	local := make(map[string]func() []net.Addr)
	t.Run("clients", func(t *testing.T) {
		for _, k := range clientKinds {
			dial, addrs := k.dialer(env)
			local[k.name] = addrs
			t.Run(k.name, func(t *testing.T) {
				t.Parallel()
				ctx := harness.Context(t)
				cc, err := grpc.NewClient("passthrough:///"+s.ln.Addr().String(),
					grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
						return dial(ctx, "tcp", addr)
					}),
					grpc.WithTransportCredentials(insecure.NewCredentials()))
				require.NoError(t, err)
				defer cc.Close()
				c := echosvc.NewClient(cc)
				for i := range 20 {
					in := echosvc.Fill(i, 1<<i)
					out, err := c.Echo(ctx, in)
					require.NoError(t, err, "Echo(%d bytes)", len(in))
					require.Equal(t, in, out, "Echo(%d bytes)", len(in))
				}
				stream, err := c.Generate(ctx, 16, 64<<10)
				require.NoError(t, err)
				for i := range 16 {
					m, err := stream.Recv()
					require.NoError(t, err)
					require.Equal(t, echosvc.Fill(i, 64<<10), m.Data)
				}
				_, err = stream.Recv()
				require.ErrorIs(t, err, io.EOF)
			})
		}
	})
	requireServerTransports(t, s.ln, local)
	for _, d := range []string{"rdma-over-tcp", "rdma-over-quic", "tcp", "quic"} {
		require.Len(t, local[d](), 1, "%s: one connection", d)
	}
}

// TestMixedClientsHTTP serves one http.Server, on one Listener, to every kind of
// client at once; each request reports its transport.
func TestMixedClientsHTTP(t *testing.T) {
	env := mixedEnv(t)
	ln := env.Listen(t)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprintf(w, "%d bytes over %s", n, rsockhttp.ConnTransport(r))
		}),
		ConnContext: rsockhttp.ConnContext,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		require.NoError(t, srv.Shutdown(harness.Context(t)))
		require.ErrorIs(t, <-served, http.ErrServerClosed)
	}()

	local := make(map[string]func() []net.Addr)
	t.Run("clients", func(t *testing.T) {
		for _, k := range clientKinds {
			dial, addrs := k.dialer(env)
			local[k.name] = addrs
			t.Run(k.name, func(t *testing.T) {
				t.Parallel()
				ctx := harness.Context(t)
				tr := rsockhttp.NewTransport(nil)
				tr.DialContext = dial
				defer tr.CloseIdleConnections()
				c := &http.Client{Transport: tr}
				for i := range 20 {
					size := 1 << i
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, ln.URL(), harness.Payload(uint64(i), int64(size)))
					require.NoError(t, err)
					resp, err := c.Do(req)
					require.NoError(t, err)
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					require.NoError(t, err)
					require.Equal(t, strconv.Itoa(size)+" bytes over "+k.want, string(body))
				}
			})
		}
	})
	requireServerTransports(t, ln, local)
	for _, k := range clientKinds {
		require.Len(t, local[k.name](), 1, "%s: one kept-alive connection", k.name)
	}
}

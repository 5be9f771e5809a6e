package rsock

import (
	"time"

	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs/soft"
)

// rdmaConfigs returns server and client Configs that upgrade over one soft fabric, on
// bootstrap transport f. They allow plaintext RDMA under QUIC, so that the tests using
// them exercise the RDMA stream itself; secure_test.go covers the encrypted default.
func rdmaConfigs(t testing.TB, f Fallback, fab *soft.Fabric) (server, client *Config) {
	server, client = configs(t, f)
	server.Provider, client.Provider = fab, fab
	server.AllowPlaintextRDMA, client.AllowPlaintextRDMA = true, true
	return server, client
}

// requireReleased checks that every soft resource went back to the fabric.
//
// A Close that races a Read in progress leaves the release to that Read, which returns
// at once; so it waits for the release, up to 30 s, instead of sampling the counts the
// moment Close returned.
func requireReleased(t testing.TB, fab *soft.Fabric) {
	t.Helper()
	held := func() int {
		rdma.CloseIdle(nil) // a device stays open after its last connection, for a while
		s := fab.Stats()
		return s.QPs + s.MRs + s.CQs + s.PDs + s.Contexts + s.CompChannels
	}
	if !assert.Eventually(t, func() bool { return held() == 0 }, 30*time.Second, time.Millisecond) {
		t.Fatalf("soft resources left: %+v", fab.Stats())
	}
}

func TestRDMANetConn(t *testing.T) {
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, f, fab)
			ln := listen(t, scfg)
			for _, side := range []string{"Client", "Server"} {
				t.Run(side, func(t *testing.T) {
					nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
						c, s := pipe(t, ln, ccfg)
						require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
						require.Equal(t, TransportRDMA, s.Transport(), "server: %v", s.FallbackReason())
						require.NoError(t, c.FallbackReason())
						require.NoError(t, s.FallbackReason())
						stop = func() { c.Close(); s.Close() }
						if side == "Server" {
							return s, c, stop, nil
						}
						return c, s, stop, nil
					})
				})
			}
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}

// apartProvider is a fabric seen through a provider value of its own: a Config with it
// opens the fabric's devices apart from a Config with the fabric itself, as another
// process would. Registered memory is counted per opened device, and the Listener
// prepares its side ahead only on a device already open (prepareEarly), so a client and
// a server sharing one opened device raced for it: which of them registered first
// decided whose budget, or whose failing allocation, refused the upgrade
// (TestRDMAFallbackReasons, one run in about 300 on a loaded machine).
type apartProvider struct{ *soft.Fabric }

// TestRDMAFallbackReasons covers upgrades that cannot happen: each falls back with a
// reason naming the cause, and the connection works. The client's device is opened
// apart from the Listener's (apartProvider), so the client registers first and alone
// counts against its budget, and the server's likewise.
func TestRDMAFallbackReasons(t *testing.T) {
	tests := []struct {
		name       string
		setup      func(fab *soft.Fabric, scfg, ccfg *Config)
		clientWhy  error
		serverWhy  error
		clientPeer bool
		// clientText and serverText, if set, are in the reasons' texts.
		clientText, serverText string
	}{
		// Configurations without RDMA are explicit: a nil Provider is the default one,
		// which finds a device where the build and the machine have one.
		{
			name:      "server has no provider",
			setup:     func(fab *soft.Fabric, scfg, ccfg *Config) { scfg.Provider, scfg.DisableRDMA = nil, true },
			clientWhy: ErrNoProvider, serverWhy: ErrNoProvider, clientPeer: true,
		},
		{
			name:      "server's provider has no device",
			setup:     func(fab *soft.Fabric, scfg, ccfg *Config) { scfg.Provider = fakeProvider{} },
			clientWhy: ErrNoDevice, serverWhy: ErrNoDevice, clientPeer: true,
		},
		{
			name:      "client's provider has no device",
			setup:     func(fab *soft.Fabric, scfg, ccfg *Config) { ccfg.Provider = fakeProvider{} },
			clientWhy: ErrNoDevice, serverWhy: ErrPeerOfferedNone,
		},
		{
			name:      "registration fails on the client",
			setup:     func(fab *soft.Fabric, scfg, ccfg *Config) { fab.FailAllocs(soft.AllocMR, 1) },
			clientWhy: ErrResourcesExhausted, serverWhy: ErrPeerOfferedNone,
		},
		{
			name: "client's registered-memory budget",
			// Below the default ring (8 KiB) and its 64-byte mailbox.
			setup:     func(fab *soft.Fabric, scfg, ccfg *Config) { ccfg.MaxRegisteredMemory = 8 << 10 },
			clientWhy: ErrMemoryBudget, serverWhy: ErrPeerOfferedNone,
			clientText: "register 8256-byte receive ring: rdma: registered-memory budget exceeded: 8256 bytes more on soft0 would make 8256, over the budget of 8192 (MaxRegisteredMemory)",
		},
		{
			name:      "server's registered-memory budget",
			setup:     func(fab *soft.Fabric, scfg, ccfg *Config) { scfg.MaxRegisteredMemory = 8 << 10 },
			clientWhy: ErrResourcesExhausted, serverWhy: ErrMemoryBudget, clientPeer: true,
			serverText: "register 8256-byte receive ring: rdma: registered-memory budget exceeded: 8256 bytes more on soft0 would make 8256, over the budget of 8192 (MaxRegisteredMemory)",
		},
		{
			name:      "client disabled RDMA",
			setup:     func(fab *soft.Fabric, scfg, ccfg *Config) { ccfg.DisableRDMA = true },
			clientWhy: ErrNoProvider, serverWhy: ErrPeerOfferedNone,
		},
		{
			name:      "negative connection limit means none",
			setup:     func(fab *soft.Fabric, scfg, ccfg *Config) { scfg.MaxRDMAConns, ccfg.MaxRDMAConns = -1, -1 },
			clientWhy: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
			ccfg.Provider = apartProvider{fab}
			tt.setup(fab, scfg, ccfg)
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			if tt.clientWhy == nil {
				require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
			} else {
				require.Equal(t, TransportTCP, c.Transport())
				require.ErrorIs(t, c.FallbackReason(), tt.clientWhy)
				require.ErrorIs(t, s.FallbackReason(), tt.serverWhy)
				require.Equal(t, tt.clientPeer, errors.Is(c.FallbackReason(), ErrPeerDeclined), "client reason %v", c.FallbackReason())
				if tt.clientText != "" {
					require.ErrorContains(t, c.FallbackReason(), tt.clientText)
				}
				if tt.serverText != "" {
					require.ErrorContains(t, s.FallbackReason(), tt.serverText)
				}
			}
			requireEcho(t, c, s)
			c.Close()
			s.Close()
			ln.Close()
			requireReleased(t, fab)
		})
	}
}

// TestRDMAConnLimit opens connections past MaxRDMAConns: the extra ones fall back to TCP
// with ErrResourcesExhausted, and RDMA is used again once one closes.
func TestRDMAConnLimit(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	// Client and server share the fabric's one device here, so a limit of 4 admits
	// two connections (each has an endpoint at both ends).
	scfg.MaxRDMAConns, ccfg.MaxRDMAConns = 4, 4
	ln := listen(t, scfg)
	var conns []*Conn
	for i := range 3 {
		c, s := pipe(t, ln, ccfg)
		conns = append(conns, c, s)
		if i < 2 {
			require.Equal(t, TransportRDMA, c.Transport(), "conn %d: %v", i, c.FallbackReason())
			continue
		}
		require.Equal(t, TransportTCP, c.Transport(), "conn %d", i)
		require.ErrorIs(t, c.FallbackReason(), ErrResourcesExhausted)
		requireEcho(t, c, s)
	}
	conns[0].Close()
	conns[1].Close()
	c, s := pipe(t, ln, ccfg)
	require.Equal(t, TransportRDMA, c.Transport(), "after a close: %v", c.FallbackReason())
	conns = append(conns, c, s)
	for _, c := range conns {
		c.Close()
	}
	ln.Close()
	requireReleased(t, fab)
}

// requireEcho sends a line each way.
func requireEcho(t *testing.T, c, s *Conn) {
	t.Helper()
	for _, pair := range [][2]*Conn{{c, s}, {s, c}} {
		_, err := pair[0].Write([]byte("ping"))
		require.NoError(t, err)
		b := make([]byte, 4)
		_, err = io.ReadFull(pair[1], b)
		require.NoError(t, err)
		require.Equal(t, "ping", string(b))
	}
}

// TestRDMARingGrowth connects at the defaults (rings that start at 8 KiB and grow to
// 128 KiB), with a fixed ring on one side (GrowRingTo negative), and on both: a large
// request and response go through both ways, every byte checked.
func TestRDMARingGrowth(t *testing.T) {
	tests := []struct {
		name                   string
		serverGrow, clientGrow int
	}{
		{"defaults", 0, 0},
		{"fixed server ring", -1, 0},
		{"fixed client ring", 0, -1},
		{"fixed rings", -1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
			scfg.GrowRingTo, ccfg.GrowRingTo = tt.serverGrow, tt.clientGrow
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
			request, response := make([]byte, 3<<20), make([]byte, 2<<20)
			rand.NewChaCha8([32]byte{'g'}).Read(request)
			rand.NewChaCha8([32]byte{'r'}).Read(response)
			go func() {
				c.Write(request)
			}()
			got := make([]byte, len(request))
			_, err := io.ReadFull(s, got)
			require.NoError(t, err)
			require.True(t, bytes.Equal(request, got), "request differs")
			go func() {
				s.Write(response)
			}()
			got = make([]byte, len(response))
			_, err = io.ReadFull(c, got)
			require.NoError(t, err)
			require.True(t, bytes.Equal(response, got), "response differs")
			c.Close()
			s.Close()
			ln.Close()
			requireReleased(t, fab)
		})
	}
}

// TestRDMADirectPlacement: the two sides agree on direct placement in their hellos,
// and only when neither turned it off; a stream of large Reads and Writes arrives
// whole either way.
func TestRDMADirectPlacement(t *testing.T) {
	tests := []struct {
		name           string
		serverOff      bool
		clientOff      bool
		wantPlacements bool
	}{
		{"both allow", false, false, true},
		{"server turns it off", true, false, false},
		{"client turns it off", false, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
			scfg.NoDirectPlacement, ccfg.NoDirectPlacement = tt.serverOff, tt.clientOff
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
			require.Equal(t, tt.wantPlacements, c.st.engine.Placing(), "client placing")
			require.Equal(t, tt.wantPlacements, s.st.engine.Placing(), "server placing")
			data := make([]byte, 8<<20)
			rand.NewChaCha8([32]byte{'p'}).Read(data)
			go func() {
				for off := 0; off < len(data); off += 1 << 20 {
					if _, err := c.Write(data[off : off+1<<20]); err != nil {
						return
					}
				}
				c.CloseWrite()
			}()
			var got []byte
			buf := make([]byte, 1<<20)
			for {
				n, err := s.Read(buf)
				got = append(got, buf[:n]...)
				if err == io.EOF {
					break
				}
				require.NoError(t, err)
			}
			require.True(t, bytes.Equal(data, got), "stream differs")
			st := s.Stats()
			if !tt.wantPlacements {
				require.Zero(t, st.Placements, "placements")
			}
			t.Logf("%d placements, %d bytes", st.Placements, st.BytesPlaced)
			c.Close()
			s.Close()
			ln.Close()
			requireReleased(t, fab)
		})
	}
}

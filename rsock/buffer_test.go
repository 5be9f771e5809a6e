package rsock

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// absorb writes the seeded stream to c in 64 KiB Writes until one blocks: until a Write
// makes no complete progress before its deadline. It returns the bytes written. The
// deadline is the only notion of "blocked" a writer has; a generous one only lets the
// transport buffer more, so it makes the comparison below more lenient, not flaky.
func absorb(t *testing.T, c net.Conn, stream []byte) int {
	t.Helper()
	n := 0
	for n < len(stream) {
		require.NoError(t, c.SetWriteDeadline(time.Now().Add(time.Second)))
		m, err := c.Write(stream[n:min(len(stream), n+64<<10)])
		n += m
		if errors.Is(err, os.ErrDeadlineExceeded) {
			require.NoError(t, c.SetWriteDeadline(time.Time{}))
			return n
		}
		require.NoError(t, err)
	}
	t.Fatalf("%d bytes written and Write never blocked", n)
	return n
}

// TestAbsorbLikeTCP measures, in one run, how much a writer gets rid of before Write
// blocks when the peer has not accepted, and when it has accepted but does not read:
// over TCP loopback, and over rsock on soft RDMA. rsock must absorb at least 0.9× what
// TCP does. Then the reader reads, and every byte is checked.
func TestAbsorbLikeTCP(t *testing.T) {
	stream := make([]byte, 64<<20)
	rand.NewChaCha8([32]byte{'a', 'b', 's'}).Read(stream)

	type endpoints struct {
		dial   func() net.Conn
		accept func() net.Conn
	}
	tcp := func(t *testing.T) endpoints {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		return endpoints{
			dial: func() net.Conn {
				c, err := net.Dial("tcp", ln.Addr().String())
				require.NoError(t, err)
				return c
			},
			accept: func() net.Conn {
				s, err := ln.Accept()
				require.NoError(t, err)
				return s
			},
		}
	}
	fab := soft.New(soft.Options{})
	rsockEndpoints := func(setup func(scfg, ccfg *Config)) func(t *testing.T) endpoints {
		return func(t *testing.T) endpoints {
			scfg, ccfg := configs(t, FallbackTCP)
			setup(scfg, ccfg)
			ln := listen(t, scfg)
			return endpoints{
				dial: func() net.Conn {
					c, err := Dial("tcp", ln.Addr().String(), ccfg)
					require.NoError(t, err)
					require.Equal(t, TransportRDMA, c.Transport(), "%v", c.FallbackReason())
					return c
				},
				accept: func() net.Conn {
					s, err := ln.AcceptRsock()
					require.NoError(t, err)
					require.Equal(t, TransportRDMA, s.Transport())
					return s
				},
			}
		}
	}
	type transport struct {
		name string
		eps  func(*testing.T) endpoints
	}
	transports := []transport{
		{"tcp", tcp},
		{"rsock over soft RDMA", rsockEndpoints(func(scfg, ccfg *Config) { scfg.Provider, ccfg.Provider = fab, fab })},
	}
	if _, err := defaultProvider(); err == nil {
		// Built with -tags rdma on a machine with a device: measure it too.
		transports = append(transports, transport{"rsock over the default provider", rsockEndpoints(func(*Config, *Config) {})})
	}

	// Each subtest ends by waiting a second for a Write that does not come back. TCP's
	// run for each peer goes first, and rsock's, which need its figure, in parallel once
	// both are done.
	t.Cleanup(func() { requireReleased(t, fab) }) // after the parallel subtests
	for _, accepted := range []bool{false, true} {
		peer := map[bool]string{false: "not accepted", true: "accepted, not reading"}[accepted]
		var tcpN int
		for _, tr := range transports {
			t.Run(tr.name+", "+peer, func(t *testing.T) {
				if tr.name != "tcp" {
					t.Parallel()
					require.Positive(t, tcpN, "TCP's run failed: nothing to compare with")
				}
				eps := tr.eps(t)
				c := eps.dial()
				defer c.Close()
				var s net.Conn
				if accepted {
					s = eps.accept()
				}
				n := absorb(t, c, stream)
				if !accepted {
					s = eps.accept()
				}
				defer s.Close()
				require.NoError(t, c.(interface{ CloseWrite() error }).CloseWrite())
				got, err := io.ReadAll(s)
				require.NoError(t, err)
				require.True(t, bytes.Equal(stream[:n], got), "read %d bytes of the %d written, or other bytes", len(got), n)

				if tr.name == "tcp" {
					tcpN = n
					return
				}
				t.Logf("absorbed before Write blocks, peer %s: TCP %d KiB, %s %d KiB (%.2f×)", peer, tcpN>>10, tr.name, n>>10, float64(n)/float64(tcpN))
				require.GreaterOrEqual(t, float64(n), 0.9*float64(tcpN), "%s absorbs less than 0.9× TCP's %d bytes", tr.name, tcpN)
			})
		}
	}
}

// providerCase is a way to configure both ends, and the transport it gives.
type providerCase struct {
	name, transport string
	setup           func(fab *soft.Fabric, scfg, ccfg *Config)
}

// providerCases are TCP (RDMA disabled), soft RDMA, and the default provider: RDMA
// through a real device where there is one (built with -tags rdma), else TCP.
func providerCases() []providerCase {
	_, noDefault := defaultProvider()
	return []providerCase{
		{"tcp", TransportTCP, func(_ *soft.Fabric, scfg, ccfg *Config) { scfg.DisableRDMA, ccfg.DisableRDMA = true, true }},
		{"soft", TransportRDMA, func(fab *soft.Fabric, scfg, ccfg *Config) { scfg.Provider, ccfg.Provider = fab, fab }},
		{"default", map[bool]string{true: TransportRDMA, false: TransportTCP}[noDefault == nil], func(*soft.Fabric, *Config, *Config) {}},
	}
}

// TestTCPPatterns runs what programs written for TCP do and rsock must not block or
// deadlock on, over TCP and over soft RDMA, checking every byte: a whole request
// written before the server accepts and both sides writing a large message before
// reading the other's; and a client that writes and closes before the server reads.
func TestTCPPatterns(t *testing.T) {
	const size = 2 << 20 // under each side's buffering: the ring plus ReadBufferSize
	request, response := make([]byte, size), make([]byte, size)
	rand.NewChaCha8([32]byte{'r', 'e', 'q'}).Read(request)
	rand.NewChaCha8([32]byte{'r', 'e', 's'}).Read(response)
	for _, tt := range providerCases() {
		t.Run(tt.name, func(t *testing.T) {
			tr := tt.transport
			fab := soft.New(soft.Options{})
			scfg, ccfg := configs(t, FallbackTCP)
			tt.setup(fab, scfg, ccfg)
			ln := listen(t, scfg)

			t.Run("large request and response, each written before reading", func(t *testing.T) {
				c, err := Dial("tcp", ln.Addr().String(), ccfg)
				require.NoError(t, err)
				require.Equal(t, tr, c.Transport())
				_, err = c.Write(request) // before the server accepts
				require.NoError(t, err)
				s, err := ln.AcceptRsock()
				require.NoError(t, err)
				_, err = s.Write(response) // before it reads the request
				require.NoError(t, err)
				got := make([]byte, size)
				_, err = io.ReadFull(s, got)
				require.NoError(t, err)
				require.True(t, bytes.Equal(request, got), "request differs")
				_, err = io.ReadFull(c, got)
				require.NoError(t, err)
				require.True(t, bytes.Equal(response, got), "response differs")
				require.NoError(t, c.Close())
				require.NoError(t, s.Close())
			})
			t.Run("write, close, then the server accepts and reads", func(t *testing.T) {
				c, err := Dial("tcp", ln.Addr().String(), ccfg)
				require.NoError(t, err)
				require.Equal(t, tr, c.Transport())
				_, err = c.Write(request)
				require.NoError(t, err)
				require.NoError(t, c.Close())
				s, err := ln.AcceptRsock()
				require.NoError(t, err)
				got, err := io.ReadAll(s)
				require.NoError(t, err)
				require.True(t, bytes.Equal(request, got), "%d bytes of %d, or other bytes", len(got), size)
				require.NoError(t, s.Close())
			})
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}

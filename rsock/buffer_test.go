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
	rdma := func(t *testing.T) endpoints {
		scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
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

	absorbed := map[string]int{}
	for _, accepted := range []bool{false, true} {
		for _, tr := range []struct {
			name string
			eps  func(*testing.T) endpoints
		}{{"tcp", tcp}, {"rsock-rdma", rdma}} {
			key := tr.name + map[bool]string{false: ", not accepted", true: ", accepted, not reading"}[accepted]
			t.Run(key, func(t *testing.T) {
				eps := tr.eps(t)
				c := eps.dial()
				defer c.Close()
				var s net.Conn
				if accepted {
					s = eps.accept()
				}
				n := absorb(t, c, stream)
				absorbed[key] = n
				if !accepted {
					s = eps.accept()
				}
				defer s.Close()
				require.NoError(t, c.(interface{ CloseWrite() error }).CloseWrite())
				got, err := io.ReadAll(s)
				require.NoError(t, err)
				require.True(t, bytes.Equal(stream[:n], got), "read %d bytes of the %d written, or other bytes", len(got), n)
			})
		}
		tcpKey := "tcp" + map[bool]string{false: ", not accepted", true: ", accepted, not reading"}[accepted]
		rdmaKey := "rsock-rdma" + tcpKey[3:]
		tcpN, rdmaN := absorbed[tcpKey], absorbed[rdmaKey]
		t.Logf("absorbed before Write blocks, %s: TCP %d KiB, rsock over soft RDMA %d KiB (%.2f×)", tcpKey[5:], tcpN>>10, rdmaN>>10, float64(rdmaN)/float64(tcpN))
		require.GreaterOrEqual(t, float64(rdmaN), 0.9*float64(tcpN), "rsock absorbs less than 0.9× TCP (%s)", tcpKey[5:])
	}
	requireReleased(t, fab)
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
	for _, tr := range []string{TransportTCP, TransportRDMA} {
		t.Run(tr, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := configs(t, FallbackTCP)
			scfg.DisableRDMA, ccfg.DisableRDMA = true, true
			if tr == TransportRDMA {
				scfg, ccfg = rdmaConfigs(t, FallbackTCP, fab)
			}
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

package rsock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/fallback"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
	"github.com/rsockio/rsock/verbs/soft"
)

// rawHello encodes h.
func rawHello(h hello) []byte { return h.appendTo(nil) }

// withExtra appends extra to the body of the encoded hello b.
func withExtra(b []byte, extra ...byte) []byte {
	b = append(b, extra...)
	binary.BigEndian.PutUint16(b[6:8], uint16(len(b)-helloHeaderLen))
	return b
}

// requireServing checks that ln still accepts and serves an rsock client.
func requireServing(t *testing.T, ln *Listener, cfg *Config) {
	t.Helper()
	c, s := pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	_, err := c.Write([]byte("ok?"))
	require.NoError(t, err)
	b := make([]byte, 3)
	_, err = io.ReadFull(s, b)
	require.NoError(t, err)
	_, err = s.Write([]byte("ok!"))
	require.NoError(t, err)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)
	require.Equal(t, "ok!", string(b))
}

// TestBadHellos sends broken hellos from raw TCP clients. Each connection is closed by
// the server with a logged reason, and the Listener goes on serving.
func TestBadHellos(t *testing.T) {
	v1 := rawHello(offerHello(nil))
	oversized := append([]byte(nil), v1[:6]...)
	oversized = append(oversized, 0xff, 0xff)
	badKind := append([]byte(nil), v1...)
	badKind[5] = 9
	decline := rawHello(declineHello(declineNoDevice))
	offerRDMA := rawHello(offerHello(&rdmaEndpoint{QPN: 1, MTU: 5, RingSize: 1 << 16, RecvWQEs: 1}))
	badRDMA := append([]byte(nil), offerRDMA...)
	badRDMA[helloHeaderLen+helloCapsLen+18] = 9 // MTU code 9

	tests := []struct {
		name  string
		input []byte
		log   string // expected in the log line
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "peer does not speak rsock"},
		{"tls", []byte{0x16, 0x03, 0x01, 0x00, 0x10}, "peer does not speak rsock"},
		{"magic then garbage", append(helloMagic[:], "garbage!"...), "malformed hello"},
		{"oversized", oversized, "exceeds the maximum"},
		{"unknown kind", badKind, "unknown kind 9"},
		{"answer instead of offer", decline, "an decline where an offer belongs"},
		{"truncated header", v1[:5], "truncated"},
		{"truncated body", offerRDMA[:20], "truncated"},
		{"bad rdma field", badRDMA, "RDMA MTU code 9"},
		{"empty", nil, "connection closed before its hello"},
	}
	var logs logBuffer
	scfg, ccfg := configs(t, FallbackTCP)
	scfg.Logger = logs.logger()
	ln := listen(t, scfg)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dialRaw(t, ln)
			_, err := c.Write(tt.input)
			require.NoError(t, err)
			c.(*net.TCPConn).CloseWrite() // the server may have reset it already
			// The server closes without answering (a reset is fine too).
			got, _ := io.ReadAll(c)
			require.Empty(t, got, "server's answer to %q", tt.input)
			requireServing(t, ln, ccfg)
			require.Contains(t, lastLine(logs.String()), tt.log)
		})
	}
}

// lastLine returns the last complete line of s.
func lastLine(s string) string {
	s = strings.TrimSuffix(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// TestStalledHandshakes holds handshakes open in every way a client can stall, and
// checks that Accept still returns good clients, that stalled handshakes end after the
// handshake timeout, and that Close aborts those still running.
func TestStalledHandshakes(t *testing.T) {
	v1 := rawHello(offerHello(nil))
	stalls := [][]byte{nil, v1[:3], v1[:helloHeaderLen], v1[:len(v1)-1]}

	for _, f := range transports {
		t.Run("AcceptNotBlocked/"+f.String(), func(t *testing.T) {
			scfg, ccfg := configs(t, f)
			scfg.HandshakeTimeout = time.Hour // the stalled clients never time out here
			ln := listen(t, scfg)
			var stalled []net.Conn
			for _, b := range stalls {
				var c net.Conn
				if f == FallbackQUIC {
					qc, err := fallback.DialQUIC(context.Background(), "tcp", ln.Addr().String(), &fallback.QUICOptions{TLSConfig: ccfg.TLSConfig})
					require.NoError(t, err)
					t.Cleanup(func() { qc.Close() })
					c = qc
				} else {
					c = dialRaw(t, ln)
				}
				_, err := c.Write(b)
				require.NoError(t, err)
				stalled = append(stalled, c)
			}
			requireServing(t, ln, ccfg)
			requireServing(t, ln, ccfg)
			// Close aborts the stalled handshakes: each client sees its connection end.
			require.NoError(t, ln.Close())
			for _, c := range stalled {
				got, _ := io.ReadAll(c)
				require.Empty(t, got)
			}
		})
	}

	t.Run("TimedOut", func(t *testing.T) {
		var logs logBuffer
		scfg, ccfg := configs(t, FallbackTCP)
		scfg.HandshakeTimeout = 200 * time.Millisecond
		scfg.Logger = logs.logger()
		ln := listen(t, scfg)
		// All the stalls at once: their handshakes time out together, not one after another.
		var stalled []net.Conn
		for _, b := range stalls {
			c := dialRaw(t, ln)
			_, err := c.Write(b)
			require.NoError(t, err)
			stalled = append(stalled, c)
		}
		for _, c := range stalled {
			got, _ := io.ReadAll(c) // returns when the server gives up
			require.Empty(t, got)
		}
		requireServing(t, ln, ccfg)
		require.Equal(t, len(stalls), strings.Count(logs.String(), "i/o timeout"), "timeouts logged:\n%s", logs.String())
	})

	t.Run("SlotsBounded", func(t *testing.T) {
		// With every handshake slot held by a stalled client, a good client waits for
		// a slot to free up, here by a stalled handshake timing out.
		scfg, ccfg := configs(t, FallbackTCP)
		scfg.HandshakeTimeout = 300 * time.Millisecond
		scfg.MaxConcurrentHandshakes = 2
		ln := listen(t, scfg)
		for range scfg.MaxConcurrentHandshakes {
			dialRaw(t, ln)
		}
		requireServing(t, ln, ccfg)
	})
}

// TestVersionMismatch covers both directions: a server that receives another version's
// offer declines it in its own and stays on TCP; a client that receives another
// version's decline stays on TCP, and another version's accept fails it.
func TestVersionMismatch(t *testing.T) {
	// A version 1 peer's offer with RDMA (its endpoint carried the ring's address and
	// rkey), and a future version's.
	v1offer := withExtra(rawHello(hello{version: 1, kind: helloOffer, caps: capRDMA}), make([]byte, 48)...)
	nextOffer := withExtra(rawHello(hello{version: helloVersion + 1, kind: helloOffer, caps: 0xffff}), []byte("future fields")...)

	for _, offer := range [][]byte{v1offer, nextOffer} {
		t.Run(fmt.Sprintf("Server/v%d", offer[4]), func(t *testing.T) {
			scfg, _ := configs(t, FallbackTCP)
			ln := listen(t, scfg)
			c := dialRaw(t, ln)
			_, err := c.Write(append(offer, "ping"...))
			require.NoError(t, err)
			s, err := ln.AcceptRsock()
			require.NoError(t, err)
			defer s.Close()
			require.ErrorIs(t, s.FallbackReason(), ErrVersionMismatch)
			require.Equal(t, TransportTCP, s.Transport())
			b := make([]byte, 4)
			_, err = io.ReadFull(s, b)
			require.NoError(t, err)
			require.Equal(t, "ping", string(b), "data behind the other version's hello")

			var hr helloReader
			h, err := hr.read(c)
			require.NoError(t, err)
			require.Equal(t, declineHello(declineVersionMismatch), h)
			_, err = s.Write([]byte("pong"))
			require.NoError(t, err)
			_, err = io.ReadFull(c, b)
			require.NoError(t, err)
			require.Equal(t, "pong", string(b))
		})
	}

	tests := []struct {
		name   string
		answer []byte
		err    error // of the client's first Read; nil: it reads the data
	}{
		{"next version's decline", rawHello(hello{version: helloVersion + 1, kind: helloDecline, reason: 77}), nil},
		{"next version's decline, longer body", withExtra(rawHello(hello{version: helloVersion + 1, kind: helloDecline, reason: 1}), 2, 1, 0), nil},
		{"next version's accept", rawHello(hello{version: helloVersion + 1, kind: helloAccept}), ErrVersionMismatch},
		{"version 1 accept", withExtra(rawHello(hello{version: 1, kind: helloAccept, caps: capRDMA}), make([]byte, 48)...), ErrVersionMismatch},
		{"this version's accept", rawHello(acceptHello(rdmaEndpoint{QPN: 1, MTU: 1, RingSize: 1 << 12, RecvWQEs: 1})), ErrBadHello},
	}
	for _, tt := range tests {
		t.Run("Client/"+tt.name, func(t *testing.T) {
			got := fakeServer(t, append(tt.answer, "data"...))
			c, err := Dial("tcp", got.addr, noRDMA)
			require.NoError(t, err)
			defer c.Close()
			b := make([]byte, 4)
			_, err = io.ReadFull(c, b)
			if tt.err != nil {
				require.ErrorIs(t, err, tt.err)
				_, err2 := c.Read(b)
				require.Equal(t, err, err2, "the error sticks")
				return
			}
			require.NoError(t, err)
			require.Equal(t, "data", string(b))
		})
	}
}

// noRDMA is the client Config of the tests against a fakeServer: they script the answer
// to an offer without RDMA, which a client sends whether or not the machine it runs on
// has an RDMA device only if it is told not to use one.
var noRDMA = &Config{DisableRDMA: true}

// fakeServerConn is a plain TCP server for one client: it reads the client's hello,
// records it, writes answer and closes.
type fakeServerConn struct {
	addr string
	got  chan []byte
}

func fakeServer(t *testing.T, answer []byte) fakeServerConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	f := fakeServerConn{addr: ln.Addr().String(), got: make(chan []byte, 1)}
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			f.got <- nil
			return
		}
		defer c.Close()
		b := make([]byte, len(rawHello(offerHello(nil))))
		n, _ := io.ReadFull(c, b)
		f.got <- b[:n]
		c.Write(answer)
	}()
	return f
}

// TestDialPlainServer dials servers that do not speak rsock: the first Read says so.
func TestDialPlainServer(t *testing.T) {
	tests := []struct {
		name   string
		answer []byte
		err    error
		text   string
	}{
		{"banner", []byte("SSH-2.0-OpenSSH_9.6\r\n"), ErrNotRsockPeer, `first bytes "SSH-" are not an rsock hello`},
		{"http error", []byte("HTTP/1.1 400 Bad Request\r\n\r\n"), ErrNotRsockPeer, "peer does not speak rsock"},
		{"closes at once", nil, ErrNotRsockPeer, "connection closed before its hello"},
		{"echoes", rawHello(offerHello(nil)), ErrBadHello, "answered an offer without RDMA with an offer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := fakeServer(t, tt.answer)
			c, err := Dial("tcp", srv.addr, noRDMA)
			require.NoError(t, err, "Dial does not wait for the server")
			_, err = c.Read(make([]byte, 10))
			require.ErrorIs(t, err, tt.err)
			require.ErrorContains(t, err, tt.text)
			require.ErrorContains(t, err, "rsock: server hello from 127.0.0.1:")
			if tt.answer == nil {
				require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			}
			c.Close()
			require.Equal(t, rawHello(offerHello(nil)), <-srv.got, "what the client sent")
		})
	}
}

// TestPlainClients serves rsock and plain clients on one Listener.
func TestPlainClients(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	scfg.AcceptPlainClients = true
	scfg.PlainSniffTimeout = 50 * time.Millisecond
	// The sniff's verdicts, the latest kept: the rsock client's device waits for one.
	sniffed := make(chan bool, 1)
	testHookSniffed = func(isHello bool) {
		select {
		case sniffed <- isHello:
		default:
		}
	}
	t.Cleanup(func() { testHookSniffed = nil })
	ln := listen(t, scfg)

	// A line-protocol server: a banner first, then each line echoed in upper case.
	served := make(chan error, 1)
	go func() {
		for {
			c, err := ln.AcceptRsock()
			if err != nil {
				served <- err
				return
			}
			go func() {
				defer c.Close()
				if errors.Is(c.FallbackReason(), ErrPlainClient) {
					c.Write([]byte("plain\n"))
				} else {
					c.Write([]byte("rsock\n"))
				}
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					c.Write([]byte(strings.ToUpper(sc.Text()) + "\n"))
				}
			}()
		}
	}()

	talk := func(c net.Conn, lines ...string) {
		t.Helper()
		r := bufio.NewReader(c)
		for _, l := range lines {
			_, err := c.Write([]byte(l + "\n"))
			require.NoError(t, err)
			got, err := r.ReadString('\n')
			require.NoError(t, err)
			require.Equal(t, strings.ToUpper(l)+"\n", got)
		}
	}
	banner := func(c net.Conn) string {
		t.Helper()
		b := make([]byte, 6)
		_, err := io.ReadFull(c, b)
		require.NoError(t, err)
		return string(b)
	}

	t.Run("ClientSpeaksFirst", func(t *testing.T) {
		c := dialRaw(t, ln)
		// The server reads the first line while sniffing, and hands it on first.
		_, err := c.Write([]byte("hello\n"))
		require.NoError(t, err)
		r := bufio.NewReader(c)
		got, err := r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "plain\n", got)
		got, err = r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "HELLO\n", got)
		talk(c, "again", "and again")
	})
	t.Run("ServerSpeaksFirst", func(t *testing.T) {
		c := dialRaw(t, ln)
		require.Equal(t, "plain\n", banner(c)) // after the sniff timeout
		talk(c, "hi")
	})
	t.Run("OneByte", func(t *testing.T) {
		c := dialRaw(t, ln)
		_, err := c.Write([]byte{0x89}) // the magic's first byte, then silence
		require.NoError(t, err)
		require.Equal(t, "plain\n", banner(c))
		_, err = c.Write([]byte("x\n"))
		require.NoError(t, err)
		got, err := bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, strings.ToUpper("\x89x\n"), got, "the sniffed byte is handed on")
	})
	// upgrades dials with cfg and requires an RDMA connection the server took for rsock.
	upgrades := func(t *testing.T, cfg *Config) {
		t.Helper()
		c, err := Dial("tcp", ln.Addr().String(), cfg)
		require.NoError(t, err)
		defer c.Close()
		require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
		require.Equal(t, "rsock\n", banner(c))
		talk(c, "still rsock")
	}
	t.Run("Rsock", func(t *testing.T) {
		// A device slower than the sniff: the client's device listing ends only once
		// the server has decided what the client is. The client sent the hello's magic
		// before preparing its device, so the server waits for the rest of the hello
		// and the connection upgrades.
		select {
		case <-sniffed: // an earlier subtest's
		default:
		}
		cfg := *ccfg
		cfg.Provider = &gatedProvider{Provider: fab, gate: sniffed}
		upgrades(t, &cfg)
	})
	t.Run("RsockDefaultProvider", func(t *testing.T) {
		// The same with no provider configured: finding the default one (verbs/auto's
		// probe, which lists and opens devices) ends only once the server decided.
		select {
		case <-sniffed:
		default:
		}
		var probe sync.Once
		autoDefault = func() (verbs.Provider, error) {
			probe.Do(func() { <-sniffed })
			return fab, nil
		}
		autoFresh = func() bool { return false }
		t.Cleanup(func() { autoDefault, autoFresh = auto.Default, auto.Fresh })
		cfg := *ccfg
		cfg.Provider = nil
		upgrades(t, &cfg)
	})
	t.Run("SameHost", func(t *testing.T) {
		// A same-host client with no provider configured offers shared memory: it
		// need not find the default provider, slow or not, before its hello, and the
		// server takes it for rsock (and declines: its own provider is configured).
		select {
		case <-sniffed:
		default:
		}
		autoDefault = func() (verbs.Provider, error) {
			<-sniffed
			return nil, verbs.ErrNoDevice
		}
		autoFresh = func() bool { return false }
		t.Cleanup(func() { autoDefault, autoFresh = auto.Default, auto.Fresh })
		cfg := *ccfg
		cfg.Provider, cfg.DisableSHM = nil, false
		c, err := Dial("tcp", ln.Addr().String(), &cfg)
		require.NoError(t, err)
		defer c.Close()
		require.Equal(t, "rsock\n", banner(c), "client: %s, %v", c.Transport(), c.FallbackReason())
	})
	require.NoError(t, ln.Close())
	require.ErrorIs(t, <-served, net.ErrClosed)
}

// gatedProvider is a provider whose device listing waits for a value on gate: a device
// as slow as the test needs it to be.
type gatedProvider struct {
	verbs.Provider
	gate <-chan bool
}

func (p *gatedProvider) Devices() ([]verbs.DeviceAttr, error) {
	<-p.gate
	return p.Provider.Devices()
}

// TestPlainClientWriteTo reads a plain client's bytes through WriteTo, which must hand
// back the sniffed bytes first.
func TestPlainClientWriteTo(t *testing.T) {
	scfg, _ := configs(t, FallbackTCP)
	scfg.AcceptPlainClients = true
	ln := listen(t, scfg)
	c := dialRaw(t, ln)
	_, err := c.Write([]byte("plain bytes"))
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	s, err := ln.AcceptRsock()
	require.NoError(t, err)
	defer s.Close()
	var buf bytes.Buffer
	_, err = s.WriteTo(&buf)
	require.NoError(t, err)
	require.Equal(t, "plain bytes", buf.String())
}

// TestCloseBeforeReading writes and closes without reading, before the server has
// accepted: the server must still get every byte. Over TCP, the unread answer to the
// hello must not make the kernel reset the connection; over RDMA, the server's engine
// buffers what its application has not read, so Write and Close return. It runs on TCP,
// on soft RDMA, and on the default provider: RDMA over a real device where there is
// one (built with -tags rdma), else TCP again.
func TestCloseBeforeReading(t *testing.T) {
	for _, tt := range providerCases() {
		t.Run(tt.name, func(t *testing.T) {
			tr := tt.transport
			scfg, ccfg := configs(t, FallbackTCP)
			fab := soft.New(soft.Options{})
			tt.setup(fab, scfg, ccfg)
			ln := listen(t, scfg)
			payload := make([]byte, 256<<10)
			for i := range 20 {
				rand.NewChaCha8([32]byte{byte(i)}).Read(payload)
				c, err := Dial("tcp", ln.Addr().String(), ccfg)
				require.NoError(t, err)
				require.Equal(t, tr, c.Transport(), "%v", c.FallbackReason())
				_, err = c.Write(payload)
				require.NoError(t, err)
				require.NoError(t, c.Close())
				_, err = c.Read(make([]byte, 1))
				require.ErrorIs(t, err, net.ErrClosed)

				s, err := ln.AcceptRsock()
				require.NoError(t, err)
				require.Equal(t, tr, s.Transport())
				got, err := io.ReadAll(s)
				require.NoError(t, err)
				require.True(t, bytes.Equal(payload, got), "connection %d: %d bytes of %d, or other bytes", i, len(got), len(payload))
				s.Close()
			}
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}

func TestListenerClose(t *testing.T) {
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			scfg, ccfg := configs(t, f)
			ln, err := Listen("tcp", "127.0.0.1:0", scfg)
			require.NoError(t, err)
			c, s := pipe(t, ln, ccfg)
			require.NoError(t, ln.Close())
			require.ErrorIs(t, ln.Close(), net.ErrClosed)
			_, err = ln.Accept()
			require.ErrorIs(t, err, net.ErrClosed)
			// TCP's dial is refused at once; QUIC's hears nothing back and would wait out
			// quic-go's handshake idle timeout (5 s), so a short deadline ends it.
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err = (&Dialer{Config: ccfg}).DialContext(ctx, "tcp", ln.Addr().String())
			require.Error(t, err, "dial a closed listener")

			// Accepted connections outlive their listener.
			_, err = c.Write([]byte("still here"))
			require.NoError(t, err)
			b := make([]byte, 10)
			_, err = io.ReadFull(s, b)
			require.NoError(t, err)
			c.Close()
			s.Close()
		})
	}
}

func TestDialCancelled(t *testing.T) {
	for _, f := range transports {
		scfg, ccfg := configs(t, f)
		ln := listen(t, scfg)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := (&Dialer{Config: ccfg}).DialContext(ctx, "tcp", ln.Addr().String())
		require.ErrorIs(t, err, context.Canceled, "%v", f)
	}
}

// TestQUICListenerServesTCP dials a QUIC Listener over TCP and over QUIC, on the one
// port it listens on.
func TestQUICListenerServesTCP(t *testing.T) {
	scfg, qcfg := configs(t, FallbackQUIC)
	ln := listen(t, scfg)
	require.Equal(t, ln.Addr().(*net.TCPAddr).Port, ln.QUICAddr().(*net.UDPAddr).Port)
	for _, cfg := range []*Config{nil, qcfg} {
		c, s := pipe(t, ln, cfg)
		require.Equal(t, c.Transport(), s.Transport())
		_, cport, _ := net.SplitHostPort(c.LocalAddr().String()) // QUIC's is a wildcard address
		_, sport, _ := net.SplitHostPort(s.RemoteAddr().String())
		require.Equal(t, cport, sport, "client's local and server's remote port")
		requireServing(t, ln, cfg)
		c.Close()
		s.Close()
	}
	tcpOnly := listen(t, nil)
	require.Nil(t, tcpOnly.QUICAddr())
}

package benchmarks

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/rsockio/rsock/fallback"
	"github.com/rsockio/rsock/internal/testcert"
	"github.com/rsockio/rsock/rsock"
)

// BenchmarkFallback compares rsock's fallback transports with what they wrap, in one
// run: a raw net.TCPConn against an rsock Conn over TCP, and a raw quic-go stream
// against an rsock Conn over QUIC, all on loopback.
//
//   - Stream64KiB: one-way stream of 64 KiB writes, drained by a reader goroutine.
//   - PingPong64B: a 64-byte message and its 64-byte echo; reports round-trip
//     percentiles (p50-ns, p99-ns).
//
// The targets: rsock over TCP at least 0.97 of raw TCP's throughput and within 1 µs of
// its round trip; rsock over QUIC at least 0.95 of the raw stream's throughput.
func BenchmarkFallback(b *testing.B) {
	transports := []struct {
		name string
		dial func(b *testing.B) *fbPair
	}{
		{"RawTCP", fbRawTCP},
		{"RsockTCP", func(b *testing.B) *fbPair { return fbRsock(b, rsock.FallbackTCP) }},
		{"RawQUIC", fbRawQUIC},
		{"RsockQUIC", func(b *testing.B) *fbPair { return fbRsock(b, rsock.FallbackQUIC) }},
	}
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) {
			b.Run("Stream64KiB", func(b *testing.B) { fbStream(b, tr.dial(b), 64<<10) })
			b.Run("PingPong64B", func(b *testing.B) { fbPingPong(b, tr.dial(b), 64) })
		})
	}
}

// fbPair is a connected client and server, whatever carries them.
type fbPair struct {
	client, server io.ReadWriter
	closeWrite     func() error // half-closes the client
	stop           func()       // closes everything
}

func fbStream(b *testing.B, p *fbPair, size int) {
	defer p.stop()
	drained := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for {
			if _, err := p.server.Read(buf); err != nil {
				if err == io.EOF {
					err = nil
				}
				drained <- err
				return
			}
		}
	}()
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.client.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := errors.Join(p.closeWrite(), <-drained); err != nil {
		b.Fatal(err)
	}
}

func fbPingPong(b *testing.B, p *fbPair, size int) {
	defer p.stop()
	echoed := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(p.server, buf); err != nil {
				if err == io.EOF {
					err = nil
				}
				echoed <- err
				return
			}
			if _, err := p.server.Write(buf); err != nil {
				echoed <- err
				return
			}
		}
	}()
	buf := make([]byte, size)
	roundTrip := func() {
		if _, err := p.client.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(p.client, buf); err != nil {
			b.Fatal(err)
		}
	}
	roundTrip() // warm up (rsock's client reads the server's hello here)
	samples := make([]time.Duration, 0, 1<<20)
	b.SetBytes(int64(2 * size))
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		roundTrip()
		if len(samples) < cap(samples) {
			samples = append(samples, time.Since(start))
		}
	}
	if err := errors.Join(p.closeWrite(), <-echoed); err != nil {
		b.Fatal(err)
	}
	slices.Sort(samples)
	pct := func(q float64) float64 { return float64(samples[int(q*float64(len(samples)-1))].Nanoseconds()) }
	b.ReportMetric(pct(0.50), "p50-ns")
	b.ReportMetric(pct(0.99), "p99-ns")
}

func fbRawTCP(b *testing.B) *fbPair {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	return &fbPair{
		client: c, server: s,
		closeWrite: c.(*net.TCPConn).CloseWrite,
		stop:       func() { c.Close(); s.Close() },
	}
}

func fbRsock(b *testing.B, f rsock.Fallback) *fbPair {
	scfg, ccfg := &rsock.Config{Fallback: f}, &rsock.Config{Fallback: f}
	if f == rsock.FallbackQUIC {
		scfg.TLSConfig, ccfg.TLSConfig = fbTLS(b)
	}
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", scfg)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := rsock.Dial("tcp", ln.Addr().String(), ccfg)
	if err != nil {
		b.Fatal(err)
	}
	s, err := ln.AcceptRsock()
	if err != nil {
		b.Fatal(err)
	}
	return &fbPair{
		client: c, server: s,
		closeWrite: c.CloseWrite,
		stop:       func() { c.Close(); s.Close() },
	}
}

// fbRawQUIC connects one quic-go stream, configured as rsock configures its own: the
// same TLS, application protocol and quic-go defaults.
func fbRawQUIC(b *testing.B) *fbPair {
	st, ct := fbTLS(b)
	st.NextProtos, ct.NextProtos = []string{fallback.NextProto}, []string{fallback.NextProto}
	ln, err := quic.ListenAddr("127.0.0.1:0", st, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	cc, err := quic.DialAddr(ctx, ln.Addr().String(), ct, nil)
	if err != nil {
		b.Fatal(err)
	}
	cs, err := cc.OpenStream()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cs.Write([]byte{0}); err != nil { // the stream reaches the server with its first byte
		b.Fatal(err)
	}
	sc, err := ln.Accept(ctx)
	if err != nil {
		b.Fatal(err)
	}
	ss, err := sc.AcceptStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(ss, make([]byte, 1)); err != nil {
		b.Fatal(err)
	}
	return &fbPair{
		client: cs, server: ss,
		closeWrite: cs.Close,
		stop: func() {
			cc.CloseWithError(0, "")
			sc.CloseWithError(0, "")
			ln.Close()
		},
	}
}

func fbTLS(b *testing.B) (server, client *tls.Config) {
	server, client, err := testcert.Configs()
	if err != nil {
		b.Fatal(err)
	}
	return server, client
}

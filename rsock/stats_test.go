package rsock

import (
	"fmt"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs/soft"
)

// statsCase is a connection setup the statistics tests run on.
type statsCase struct {
	name      string
	transport string // want, on both sides
	configs   func(t *testing.T, fab *soft.Fabric) (server, client *Config)
}

var statsCases = []statsCase{
	{"tcp", TransportTCP, func(t *testing.T, _ *soft.Fabric) (*Config, *Config) { return plainConfigs(t, FallbackTCP) }},
	{"quic", TransportQUIC, func(t *testing.T, _ *soft.Fabric) (*Config, *Config) { return plainConfigs(t, FallbackQUIC) }},
	{"rdma", TransportRDMA, func(t *testing.T, fab *soft.Fabric) (*Config, *Config) {
		return rdmaConfigs(t, FallbackTCP, fab)
	}},
	{"rdma+tls", TransportRDMATLS, func(t *testing.T, fab *soft.Fabric) (*Config, *Config) {
		s, c := rdmaConfigs(t, FallbackQUIC, fab)
		s.AllowPlaintextRDMA, c.AllowPlaintextRDMA = false, false
		return s, c
	}},
}

// TestConnStats moves bytes both ways on every transport and checks what each side's
// Stats says: the bytes, the transport, and RDMA-only fields that are zero off RDMA.
func TestConnStats(t *testing.T) {
	for _, tc := range statsCases {
		t.Run(tc.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := tc.configs(t, fab)
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			const up, down = 100_000, 3000
			exchangeSizes(t, c, s, up, down)

			for _, side := range []struct {
				name              string
				conn              *Conn
				read, written     uint64
				rdmaSent, rdmaGot bool
			}{
				{"client", c, down, up, true, true},
				{"server", s, up, down, true, true},
			} {
				st := side.conn.Stats()
				require.Equal(t, tc.transport, st.Transport, "%s: %+v", side.name, st)
				require.Equal(t, side.read, st.BytesRead, "%s: BytesRead: %+v", side.name, st)
				require.Equal(t, side.written, st.BytesWritten, "%s: BytesWritten: %+v", side.name, st)
				if tc.transport == TransportTCP || tc.transport == TransportQUIC {
					require.Error(t, st.FallbackReason, "%s: %+v", side.name, st)
					require.Zero(t, st.MessagesSent+st.MessagesReceived+st.CreditStalls+st.CompletionErrors+st.RNRErrors,
						"%s: RDMA counters off RDMA: %+v", side.name, st)
					require.Zero(t, st.RingSize+st.StagingSize, "%s: RDMA buffers off RDMA: %+v", side.name, st)
					continue
				}
				require.NoError(t, st.FallbackReason, "%s", side.name)
				require.Positive(t, st.MessagesSent, "%s: %+v", side.name, st)
				require.Positive(t, st.MessagesReceived, "%s: %+v", side.name, st)
				require.Positive(t, st.RingSize, "%s: %+v", side.name, st)
				require.Positive(t, st.StagingSize, "%s: %+v", side.name, st)
				require.Zero(t, st.CompletionErrors, "%s: %+v", side.name, st)
			}
			require.NoError(t, c.Close())
			s.Close() // over rdma+tls, TLS's close_notify may find the peer gone
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}

// exchangeSizes writes up bytes from c to s and down bytes back, and reads them all.
func exchangeSizes(t *testing.T, c, s *Conn, up, down int) {
	t.Helper()
	errs := make(chan error, 2)
	go func() {
		_, err := c.Write(make([]byte, up))
		errs <- err
	}()
	go func() {
		_, err := s.Write(make([]byte, down))
		errs <- err
	}()
	_, err := io.ReadFull(s, make([]byte, up))
	require.NoError(t, err)
	_, err = io.ReadFull(c, make([]byte, down))
	require.NoError(t, err)
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}

// TestConnStatsCreditStall: a server that reads only once the client has filled its
// ring (and no buffer beyond it) makes the client stall on credit; Stats counts the
// stalls and their time, and the tracer hears of each.
func TestConnStatsCreditStall(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	for _, cfg := range []*Config{scfg, ccfg} {
		cfg.RingSize, cfg.GrowRingTo, cfg.ReadBufferSize = 16<<10, -1, -1
	}
	var mu sync.Mutex
	var stalls []time.Duration
	ccfg.Tracer = func(TraceInfo) *ConnTracer {
		return &ConnTracer{CreditStall: func(d time.Duration) {
			mu.Lock()
			stalls = append(stalls, d)
			mu.Unlock()
		}}
	}
	ln := listen(t, scfg)
	c, s := pipe(t, ln, ccfg)
	require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())

	const total = 256 << 10
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, total))
		wrote <- err
	}()
	require.Eventually(t, func() bool { return s.Stats().RingUsed == 16<<10 }, 10*time.Second, time.Millisecond,
		"the server's ring never filled: %+v", s.Stats())
	_, err := io.ReadFull(s, make([]byte, total))
	require.NoError(t, err)
	require.NoError(t, <-wrote)

	st := c.Stats()
	require.Positive(t, st.CreditStalls, "client: %+v", st)
	require.Positive(t, st.CreditStallTime, "client: %+v", st)
	mu.Lock()
	var sum time.Duration
	for _, d := range stalls {
		sum += d
	}
	require.Len(t, stalls, int(st.CreditStalls), "the tracer hears of every stall")
	require.Equal(t, st.CreditStallTime, sum, "the tracer's stalls add up to CreditStallTime")
	mu.Unlock()

	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	require.NoError(t, ln.Close())
	requireReleased(t, fab)
}

// BenchmarkStatsCost streams over soft RDMA with the statistics counted ("counting",
// what every Conn does) and with the counting turned off ("off"), side by side, to
// show what counting costs: it must allocate nothing and cost no measurable
// throughput. Besides throughput it reports cpu-ns/op, the process's CPU time (user and
// system, every goroutine: writer, reader, pollers) per Write, which a machine shared
// with other work disturbs less than wall time. Run the two modes alternately, several
// times (-count runs one mode's repetitions back to back).
func BenchmarkStatsCost(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		for _, mode := range []struct {
			name string
			off  bool
		}{{"counting", false}, {"off", true}} {
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, mode.name), func(b *testing.B) {
				rdma.StatsOff.Store(mode.off)
				defer rdma.StatsOff.Store(false)
				benchStream(b, size)
			})
		}
	}
}

// benchStream measures one-way throughput from a client to a server over soft RDMA.
func benchStream(b *testing.B, size int) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(b, FallbackTCP, fab)
	ln, err := Listen("tcp", "127.0.0.1:0", scfg)
	require.NoError(b, err)
	c, s := pipe(b, ln, ccfg)
	require.Equal(b, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, s)
		close(done)
	}()
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
	c.CloseWrite()
	<-done
	c.Close()
	s.Close()
	ln.Close()
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package rsock

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// traceLog records the events of the connections a Config's Tracer created.
type traceLog struct {
	mu     sync.Mutex
	events []string
	closed []ConnStats
	failed chan error
}

func (l *traceLog) add(e string) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *traceLog) tracer(info TraceInfo) *ConnTracer {
	side := "server"
	if info.Client {
		side = "client"
	}
	return &ConnTracer{
		Upgraded: func(transport string) { l.add(side + " upgraded to " + transport) },
		FellBack: func(transport string, reason error) {
			if reason == nil || reason != info.Conn.FallbackReason() {
				l.add(side + " fell back without its reason")
			}
			l.add(side + " fell back to " + transport)
		},
		Failed: func(err error) { l.failed <- err },
		Closed: func(s ConnStats) {
			l.mu.Lock()
			l.events = append(l.events, side+" closed")
			l.closed = append(l.closed, s)
			l.mu.Unlock()
		},
	}
}

// TestTracerEvents checks the events a tracer hears on each transport: how the
// connection was set up, then its close with its final statistics.
func TestTracerEvents(t *testing.T) {
	for _, tc := range statsCases {
		t.Run(tc.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := tc.configs(t, fab)
			log := &traceLog{failed: make(chan error, 2)}
			scfg.Tracer, ccfg.Tracer = log.tracer, log.tracer
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			exchangeSizes(t, c, s, 500, 5)
			require.NoError(t, c.Close())
			c.Close() // the second Close is not another event
			s.Close()

			how := "upgraded to "
			if tc.transport == TransportTCP || tc.transport == TransportQUIC {
				how = "fell back to "
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			require.Equal(t, []string{"client " + how + tc.transport, "server " + how + tc.transport, "client closed", "server closed"}, log.events)
			require.Equal(t, uint64(500), log.closed[0].BytesWritten, "client's last stats: %+v", log.closed[0])
			require.Equal(t, uint64(500), log.closed[1].BytesRead, "server's last stats: %+v", log.closed[1])
			require.Empty(t, log.failed, "no failure")
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}

// TestTracerFailed: a connection reset by its peer is a failure the tracer hears of;
// the end of a stream is not.
func TestTracerFailed(t *testing.T) {
	log := &traceLog{failed: make(chan error, 2)}
	ln := listen(t, &Config{DisableSHM: true, DisableRDMA: true})
	c, s := pipe(t, ln, &Config{Tracer: log.tracer, DisableSHM: true, DisableRDMA: true})
	exchangeSizes(t, c, s, 1, 1)
	s.tcp.SetLinger(0) // Close resets the connection
	require.NoError(t, s.Close())
	_, err := io.ReadAll(c)
	require.Error(t, err, "the client reads the reset")
	require.ErrorIs(t, <-log.failed, err)
	_, err = c.Write([]byte("x"))
	require.Error(t, err)
	require.Empty(t, log.failed, "only the first failure")
	require.NoError(t, c.Close())

	// A clean end: no failure.
	c, s = pipe(t, ln, &Config{Tracer: log.tracer, DisableSHM: true, DisableRDMA: true})
	require.NoError(t, s.Close())
	_, err = io.ReadAll(c)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.Empty(t, log.failed, "io.EOF is no failure")
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, net.ErrClosed)
	require.Empty(t, log.failed, "a closed Conn is no failure")
}

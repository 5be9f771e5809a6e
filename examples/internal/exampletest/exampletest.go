// Package exampletest holds the scaffolding that the tests of the examples share: running
// a test once over soft RDMA and once over TCP, running an example's server until the
// test stops it, and a log that a test can read while a server still writes to it.
//
// It is for the examples' tests only; the examples themselves do not import it.
//
// # Usage
//
//	func TestRun(t *testing.T) {
//		exampletest.ForEachTransport(t, func(t *testing.T, tr exampletest.Transport, ln *rsock.Listener) {
//			// ... run the example against ln, with tr.Config on the other end ...
//			require.Contains(t, out.String(), tr.Pick("over rdma\n", "over tcp\n"))
//		})
//	}
package exampletest

import (
	"context"
	"log"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/harness"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs/soft"
)

// VerifyTestMain runs a package's tests, as a TestMain does, and then fails them if a
// goroutine outlives them: the examples' servers and clients must stop everything they
// start (harness.VerifyTestMain: the devices rsock keeps open after their last
// connection are closed first).
func VerifyTestMain(m *testing.M) { harness.VerifyTestMain(m) }

// Transport is one way an example's two ends connect in a test.
type Transport struct {
	// Name is "rdma" or "tcp". It names the subtest.
	Name string
	// Config is for both ends. For "rdma" it holds a fresh software RDMA provider
	// shared by the two ends; for "tcp" a provider without devices, so that the ends
	// fall back to TCP even on a machine with RDMA.
	Config *rsock.Config
}

// ForEachTransport runs test as two subtests of t: "rdma", both ends on the software
// RDMA provider, then "tcp", neither end with an RDMA device. Each gets a listener on a
// loopback port of the kernel's choosing, made with the transport's Config, for the
// example's server side. The listener stays open when test returns: closing it is part
// of what the examples' servers do when they stop, so a test that serves it otherwise
// closes it itself.
func ForEachTransport(t *testing.T, test func(t *testing.T, tr Transport, ln *rsock.Listener)) {
	run := func(tr Transport) {
		t.Run(tr.Name, func(t *testing.T) {
			ln, err := rsock.Listen("tcp", "127.0.0.1:0", tr.Config)
			require.NoError(t, err)
			test(t, tr, ln)
		})
	}
	run(Transport{Name: "rdma", Config: &rsock.Config{Provider: soft.New(soft.Options{})}})
	run(Transport{Name: "tcp", Config: &rsock.Config{Provider: harness.NoRDMA{}}}) // TCP, even on a machine with RDMA
}

// Pick returns what a test expects on this transport: rdma on "rdma", tcp on "tcp".
func (tr Transport) Pick(rdma, tcp string) string {
	if tr.Name == "rdma" {
		return rdma
	}
	return tcp
}

// Log collects what a [log.Logger] writes, for a test to read while the logger may
// still be writing from other goroutines. The zero value is ready to use.
type Log struct {
	mu sync.Mutex
	b  strings.Builder
}

// Logger returns a logger without prefix or flags that writes to l.
func (l *Log) Logger() *log.Logger { return log.New(l, "", 0) }

// Write implements io.Writer.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Server is an example's serve function running in a goroutine, as its main runs it,
// logging to a [Log].
type Server struct {
	log    Log
	cancel context.CancelFunc
	served chan error
}

// Serve starts serve in a goroutine with a logger that writes to the Server's log. The
// context serve gets is done when [Server.Stop] is called or the test ends.
func Serve(t *testing.T, serve func(ctx context.Context, logger *log.Logger) error) *Server {
	ctx, cancel := context.WithCancel(t.Context())
	s := &Server{cancel: cancel, served: make(chan error, 1)}
	go func() { s.served <- serve(ctx, s.log.Logger()) }()
	return s
}

// Stop cancels serve's context: the example's signal to stop. It does not wait.
func (s *Server) Stop() { s.cancel() }

// Wait waits for serve to return and returns its error.
func (s *Server) Wait() error { return <-s.served }

// Logs returns what serve has logged so far.
func (s *Server) Logs() string { return s.log.String() }

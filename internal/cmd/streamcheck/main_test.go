package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is an io.Writer the test can read while run writes to it; streaming is
// closed once run has printed "streaming".
type syncBuffer struct {
	mu        sync.Mutex
	b         strings.Builder
	streaming chan struct{}
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{streaming: make(chan struct{})} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	if strings.Contains(string(p), "streaming") {
		close(s.streaming)
	}
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPortDown runs what the VM runs, in one process over soft RDMA: a server on soft1
// (127.0.0.2) and a client on soft0 stream both ways; once both say "streaming",
// soft1's port goes down, mid-stream or with the connection idle. The server fails
// with ErrPortDown, the client with a named error of its own, never a clean end of
// stream, and each side read a verified prefix of what the other wrote.
func TestPortDown(t *testing.T) {
	for _, tt := range []struct {
		name string
		idle bool
	}{{"mid-stream", false}, {"idle", true}} {
		t.Run(tt.name, func(t *testing.T) {
			f := soft.New(soft.Options{Devices: 2, TimeScale: 0.01})
			cfg := &rsock.Config{Provider: f, KeepAlive: 100 * time.Millisecond}
			ln, err := rsock.Listen("tcp", "127.0.0.2:0", cfg)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			var server, client result
			sout, cout := newSyncBuffer(), newSyncBuffer()
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				c, err := ln.AcceptRsock()
				if assertNoError(t, err) {
					server = run(ctx, c, true, tt.idle, sout)
				}
			}()
			go func() {
				defer wg.Done()
				c, err := connect(ctx, "", ln.Addr().String(), cfg)
				if assertNoError(t, err) {
					client = run(ctx, c, false, tt.idle, cout)
				}
			}()
			ended := make(chan struct{})
			go func() { wg.Wait(); close(ended) }()
			for _, out := range []*syncBuffer{sout, cout} {
				select {
				case <-out.streaming:
				case <-ended:
					t.Fatalf("ended before streaming: server %+v, client %+v", server, client)
				case <-ctx.Done():
					t.Fatalf("never streaming; server:\n%s\nclient:\n%s", sout.String(), cout.String())
				}
			}
			require.NoError(t, f.SetPortState("soft1", 1, verbs.PortDown))
			wg.Wait()
			ln.Close()

			require.Contains(t, sout.String(), "transport rdma")
			require.Contains(t, cout.String(), "transport rdma")
			require.False(t, server.corrupt || client.corrupt, "a byte arrived that was not written")
			require.ErrorIs(t, server.writeErr, rsock.ErrPortDown, "the server's Write")
			require.ErrorIs(t, server.readErr, rsock.ErrPortDown, "the server's Read")
			for _, err := range []error{client.writeErr, client.readErr} {
				require.True(t, errors.Is(err, rsock.ErrControlLost) || errors.Is(err, rsock.ErrQPFailed) ||
					errors.Is(err, rsock.ErrPeerClosed), "the client's error names the cause: %v", err)
				require.False(t, errors.Is(err, io.EOF), "never a clean end of stream: %v", err)
			}
			require.LessOrEqual(t, client.read, server.wrote, "the client read more than the server wrote")
			require.LessOrEqual(t, server.read, client.wrote, "the server read more than the client wrote")
		})
	}
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

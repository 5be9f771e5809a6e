package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rsockio/rsock/internal/e2e/harness"
	"github.com/rsockio/rsock/rsock"
	"github.com/rsockio/rsock/verbs/soft"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// syncBuffer is a bytes.Buffer safe for concurrent writes, for a log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestServe(t *testing.T) {
	tests := []struct {
		name     string
		provider bool // give both ends the software RDMA provider
		want     string
	}{
		{"rdma", true, "connected over rdma\n"},
		{"tcp", false, "connected over tcp (not rdma: rsock: upgrade to rdma: peer offered no RDMA)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &rsock.Config{Provider: harness.NoRDMA{}} // TCP, even on a machine with RDMA
			if tt.provider {
				cfg.Provider = soft.New(soft.Options{})
			}
			ln, err := rsock.Listen("tcp", "127.0.0.1:0", cfg)
			require.NoError(t, err)
			var logs syncBuffer
			ctx, cancel := context.WithCancel(t.Context())
			served := make(chan error, 1)
			go func() { served <- serve(ctx, ln, log.New(&logs, "", 0)) }()

			c, err := rsock.Dial("tcp", ln.Addr().String(), cfg)
			require.NoError(t, err)
			defer c.Close()
			msg := bytes.Repeat([]byte("echo "), 100_000)
			go func() {
				c.Write(msg)
				c.CloseWrite()
			}()
			got, err := io.ReadAll(c)
			require.NoError(t, err)
			require.Equal(t, msg, got)

			// A second client, still connected when the server stops.
			c2, err := rsock.Dial("tcp", ln.Addr().String(), cfg)
			require.NoError(t, err)
			defer c2.Close()
			_, err = c2.Write([]byte("x"))
			require.NoError(t, err)
			_, err = io.ReadFull(c2, make([]byte, 1))
			require.NoError(t, err)

			cancel()
			require.NoError(t, <-served)
			_, err = c2.Read(make([]byte, 1))
			require.ErrorIs(t, err, io.EOF, "the server closes open connections when it stops")
			require.Contains(t, logs.String(), tt.want)
			require.Contains(t, logs.String(), "echoed 500000 bytes")
		})
	}
}

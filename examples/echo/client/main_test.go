package main

import (
	"io"
	"strings"
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

func TestRun(t *testing.T) {
	tests := []struct {
		name     string
		provider bool // give both ends the software RDMA provider
		want     string
	}{
		{"rdma", true, "over rdma\necho: hello, rsock\n"},
		{"tcp", false, "over tcp\nnot rdma: rsock: upgrade to rdma: no RDMA device"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &rsock.Config{Provider: harness.NoRDMA{}} // TCP, even on a machine with RDMA
			if tt.provider {
				cfg.Provider = soft.New(soft.Options{})
			}
			ln, err := rsock.Listen("tcp", "127.0.0.1:0", cfg)
			require.NoError(t, err)
			defer ln.Close()
			var wg sync.WaitGroup
			defer wg.Wait()
			wg.Go(func() { // a one-connection echo server
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				io.Copy(c, c)
			})

			var out strings.Builder
			require.NoError(t, run(t.Context(), ln.Addr().String(), cfg, "hello, rsock", &out))
			require.Contains(t, out.String(), "connected to "+ln.Addr().String())
			require.Contains(t, out.String(), tt.want)
		})
	}
}

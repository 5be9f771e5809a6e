package main

import (
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/examples/internal/exampletest"
	"github.com/rsockio/rsock/rsock"
)

func TestMain(m *testing.M) {
	exampletest.VerifyTestMain(m)
}

func TestRun(t *testing.T) {
	exampletest.ForEachTransport(t, func(t *testing.T, tr exampletest.Transport, ln *rsock.Listener) {
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
		require.NoError(t, run(t.Context(), ln.Addr().String(), tr.Config, "hello, rsock", &out))
		require.Contains(t, out.String(), "connected to "+ln.Addr().String())
		require.Contains(t, out.String(), tr.Pick("over rdma\necho: hello, rsock\n", "over tcp\nnot rdma: rsock: upgrade to rdma: no RDMA device"))
	})
}

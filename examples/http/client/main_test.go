package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/examples/internal/exampletest"
	"github.com/rsockio/rsock/rsock"
)

func TestMain(m *testing.M) {
	exampletest.VerifyTestMain(m)
}

// TestRun runs the client against a server like examples/http/server's, over soft RDMA
// and over TCP.
func TestRun(t *testing.T) {
	exampletest.ForEachTransport(t, func(t *testing.T, tr exampletest.Transport, ln *rsock.Listener) {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "hello over", tr.Name)
		})
		mux.HandleFunc("POST /sha256", func(w http.ResponseWriter, r *http.Request) {
			h := sha256.New()
			n, _ := io.Copy(h, r.Body)
			fmt.Fprintf(w, "%d %x\n", n, h.Sum(nil))
		})
		srv := &http.Server{Handler: mux}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()

		var out strings.Builder
		require.NoError(t, run(t.Context(), "http://"+ln.Addr().String(), tr.Config, 3, 1<<20, &out))
		got := out.String()
		require.Equal(t, 1, strings.Count(got, "new connection"), "three GETs and a POST on one kept-alive connection:\n%s", got)
		require.Equal(t, 3, strings.Count(got, "GET /: hello over "+tr.Name), got)
		require.Contains(t, got, tr.Pick("over rdma\nGET /: hello over rdma\n", "over tcp\nnot rdma: rsock: upgrade to rdma: no RDMA device"))
		require.Contains(t, got, "POST /sha256: 1 MiB in ")
		require.Contains(t, got, "the server's SHA-256 matches")

		require.NoError(t, srv.Shutdown(t.Context()))
		require.ErrorIs(t, <-served, http.ErrServerClosed)
	})
}

package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"strings"
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

// TestRun runs the client against a server like examples/http/server's, over soft RDMA
// and over TCP.
func TestRun(t *testing.T) {
	tests := []struct {
		name     string
		provider bool // give both ends the software RDMA provider
		want     string
	}{
		{"rdma", true, "over rdma\nGET /: hello over rdma\n"},
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
			mux := http.NewServeMux()
			mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintln(w, "hello over", tt.name)
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
			require.NoError(t, run(t.Context(), "http://"+ln.Addr().String(), cfg, 3, 1<<20, &out))
			got := out.String()
			require.Equal(t, 1, strings.Count(got, "new connection"), "three GETs and a POST on one kept-alive connection:\n%s", got)
			require.Equal(t, 3, strings.Count(got, "GET /: hello over "+tt.name), got)
			require.Contains(t, got, tt.want)
			require.Contains(t, got, "POST /sha256: 1 MiB in ")
			require.Contains(t, got, "the server's SHA-256 matches")

			require.NoError(t, srv.Shutdown(t.Context()))
			require.ErrorIs(t, <-served, http.ErrServerClosed)
		})
	}
}

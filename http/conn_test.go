package rsockhttp_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/internal/harness"
	"github.com/rsockio/rsock/internal/testcert"
	"github.com/rsockio/rsock/rsock"
)

// TestConn: a handler gets the *rsock.Conn behind its request, on every transport: the
// very connection the server accepted, with its transport and fallback reason.
func TestConn(t *testing.T) {
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		conns := make(chan *rsock.Conn, 1)
		s := serve(t, env, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c := rsockhttp.Conn(r)
			conns <- c
			if c == nil {
				http.Error(w, "no rsock.Conn", http.StatusInternalServerError)
				return
			}
			fmt.Fprintf(w, "%s reason=%v", c.Transport(), c.FallbackReason())
		}))
		c, _, _ := client(t, env)
		body, err := get(harness.Context(t), c, s.ln.URL()+"/")
		require.NoError(t, err)
		got := <-conns
		accepted := s.ln.Conns()
		require.Len(t, accepted, 1)
		require.Same(t, accepted[0].Conn, got, "rsockhttp.Conn(r) is the accepted connection")
		require.Equal(t, fmt.Sprintf("%s reason=%v", env.Want, got.FallbackReason()), body)
	})
}

// TestConnThroughTLS: a server that serves TLS on an rsock Listener gets the *tls.Conn
// in ConnContext; Conn looks through it to the rsock connection.
func TestConnThroughTLS(t *testing.T) {
	st, ct, err := testcert.Configs()
	require.NoError(t, err)
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", &rsock.Config{DisableRDMA: true})
	require.NoError(t, err)
	transports := make(chan string, 1)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c := rsockhttp.Conn(r); c != nil {
				transports <- c.Transport()
			} else {
				transports <- "none"
			}
		}),
		ConnContext: rsockhttp.ConnContext,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(tls.NewListener(ln, st)) }()
	tr := rsockhttp.NewTransport(&rsock.Config{DisableRDMA: true})
	tr.TLSClientConfig = ct
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + ln.Addr().String() + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, rsock.TransportTCP, <-transports, "rsockhttp.Conn under TLS")
	require.NoError(t, srv.Close())
	require.ErrorIs(t, <-done, http.ErrServerClosed)
}

// selfWrapper is a connection whose NetConn returns itself.
type selfWrapper struct{ net.Conn }

func (s selfWrapper) NetConn() net.Conn { return s }

func TestConnWithoutRsock(t *testing.T) {
	tests := []struct {
		name string
		conn net.Conn // nil: no ConnContext
	}{
		{"without ConnContext", nil},
		{"a *net.TCPConn", &net.TCPConn{}},
		{"a wrapper of itself", selfWrapper{}},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if tt.conn != nil {
			r = r.WithContext(rsockhttp.ConnContext(r.Context(), tt.conn))
		}
		require.Nil(t, rsockhttp.Conn(r), tt.name)
	}
}

package rsockhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"

	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/internal/harness"
)

func TestMain(m *testing.M) {
	harness.VerifyTestMain(m)
}

// server is an unmodified http.Server serving on a recording rsock Listener.
type server struct {
	*http.Server
	ln   *harness.Listener
	done chan error // Serve's result
}

// serve serves h on a new Listener of env; handlers learn their transport through
// rsockhttp.ConnTransport. The server is closed when the test ends.
func serve(t *testing.T, env *harness.Env, h http.Handler) *server {
	t.Helper()
	s := &server{
		Server: &http.Server{Handler: h, ConnContext: rsockhttp.ConnContext},
		ln:     env.Listen(t),
		done:   make(chan error, 1),
	}
	go func() { s.done <- s.Serve(s.ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := s.wait(); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return s
}

// wait returns Serve's result once it has returned; it may be called more than once.
func (s *server) wait() error {
	err := <-s.done
	s.done <- err
	return err
}

// client returns an http.Client made by rsockhttp.NewTransport from env's client
// Config, whose dials the returned Dialer records. Its idle connections are closed when
// the test ends.
func client(t *testing.T, env *harness.Env) (*http.Client, *http.Transport, *harness.Dialer) {
	t.Helper()
	d := env.Dialer()
	tr := rsockhttp.NewTransport(env.Client)
	tr.DialContext = d.DialContext
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, tr, d
}

// requireTransports checks that both ends of every connection of s and d are carried by
// env's transport, with at most max connections on each side (max < 1: no bound).
func requireTransports(t *testing.T, env *harness.Env, s *server, d *harness.Dialer, max int) {
	t.Helper()
	harness.RequireTransport(t, env.Want, s.ln.Conns(), max, "server")
	harness.RequireTransport(t, env.Want, d.Conns(), max, "client")
}

// get performs a GET of url with ctx and returns the body, requiring status 200.
func get(ctx context.Context, c *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("GET %s: read body: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), nil
}

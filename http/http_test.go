package rsockhttp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/internal/harness"
	"github.com/rsockio/rsock/rsock"
)

// TestListenAndServe runs the package's helpers as a user would: ListenAndServe on a
// port chosen by the kernel, NewClient, and Shutdown.
func TestListenAndServe(t *testing.T) {
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		addrs := make(chan net.Addr, 1)
		srv := &http.Server{
			Addr: "127.0.0.1:0",
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "%s %s over %s", r.Method, r.URL.Path, rsockhttp.ConnTransport(r))
			}),
			ConnContext: rsockhttp.ConnContext,
			BaseContext: func(ln net.Listener) context.Context {
				addrs <- ln.Addr()
				return context.Background()
			},
		}
		served := make(chan error, 1)
		go func() { served <- rsockhttp.ListenAndServe(srv, env.Server) }()
		var addr net.Addr
		select {
		case addr = <-addrs:
		case err := <-served:
			t.Fatalf("ListenAndServe: %v", err)
		}

		c := rsockhttp.NewClient(env.Client)
		tr := c.Transport.(*http.Transport)
		require.Nil(t, tr.Proxy, "NewTransport must not use a proxy")
		// NewClient's own dial function, whose connections the Env checks are closed
		// before it checks the soft RDMA resources are released.
		tr.DialContext = env.RecordDials(tr.DialContext)
		for i := range 3 { // the second and third requests reuse the connection
			body, err := get(ctx, c, fmt.Sprintf("http://%s/hello/%d", addr, i))
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("GET /hello/%d over %s", i, env.Want), body)
		}
		tr.CloseIdleConnections()
		require.NoError(t, srv.Shutdown(ctx))
		require.ErrorIs(t, <-served, http.ErrServerClosed)
	})
}

func TestConnTransportWithoutRsock(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	require.Empty(t, rsockhttp.ConnTransport(r), "without ConnContext")
	r = r.WithContext(rsockhttp.ConnContext(r.Context(), &net.TCPConn{}))
	require.Empty(t, rsockhttp.ConnTransport(r), "a *net.TCPConn is no rsock connection")
}

// TestKeepAlive sends many concurrent requests through a client limited to a few
// connections: they share kept-alive connections, all on the transport under test.
func TestKeepAlive(t *testing.T) {
	const (
		maxConns   = 4
		goroutines = 16
		perG       = 25
	)
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		s := serve(t, env, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s", r.URL.Query().Get("id"), rsockhttp.ConnTransport(r))
		}))
		c, tr, d := client(t, env)
		tr.MaxConnsPerHost = maxConns
		tr.MaxIdleConnsPerHost = maxConns

		var wg sync.WaitGroup
		errs := make(chan error, goroutines*perG)
		for g := range goroutines {
			wg.Go(func() {
				for i := range perG {
					id := strconv.Itoa(g*perG + i)
					body, err := get(ctx, c, s.ln.URL()+"/?id="+id)
					if err == nil && body != id+" "+env.Want {
						err = fmt.Errorf("request %s: body %q, want %q", id, body, id+" "+env.Want)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		// goroutines*perG requests over at most maxConns connections.
		requireTransports(t, env, s, d, maxConns)
	})
}

// TestBigBodies sends a harness.BigBody request body and receives a response body of
// the same size, each checked by its SHA-256.
func TestBigBodies(t *testing.T) {
	const size = harness.BigBody
	handler := http.NewServeMux()
	handler.HandleFunc("POST /upload", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	})
	handler.HandleFunc("GET /download", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The hash of what was sent goes in a trailer, known once it is sent.
		w.Header().Set("Trailer", "X-Sha256")
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(w, h), harness.Payload(2, n)); err != nil {
			return // the client is gone
		}
		w.Header().Set("X-Sha256", hex.EncodeToString(h.Sum(nil)))
	})
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		s := serve(t, env, handler)
		c, _, d := client(t, env)

		// Each direction has its own hang guard: QUIC in the emulated VM moves a few MB/s.
		t.Run("request", func(t *testing.T) {
			ctx := harness.Context(t)
			sent := sha256.New()
			body := io.TeeReader(harness.Payload(1, size), sent)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.ln.URL()+"/upload", body)
			require.NoError(t, err)
			req.ContentLength = size
			resp, err := c.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
			require.Equal(t, fmt.Sprintf("%d %x", size, sent.Sum(nil)), string(got), "server's count and hash of the body")
		})
		t.Run("response", func(t *testing.T) {
			ctx := harness.Context(t)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/download?n=%d", s.ln.URL(), size), nil)
			require.NoError(t, err)
			resp, err := c.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			h := sha256.New()
			n, err := io.Copy(h, resp.Body)
			require.NoError(t, err)
			require.EqualValues(t, size, n)
			t.Logf("%d MiB received", n>>20)
			require.Equal(t, resp.Trailer.Get("X-Sha256"), hex.EncodeToString(h.Sum(nil)), "hash of the body received vs sent")
		})
		requireTransports(t, env, s, d, 1)
	})
}

// TestStreamingResponse has a handler flush its response in pieces, each only after the
// client has read the one before: a piece held back in a buffer hangs the test.
func TestStreamingResponse(t *testing.T) {
	sizes := []int{1, 100, 4 << 10, 64 << 10, 1 << 20, 7}
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		acks := make(chan struct{})
		s := serve(t, env, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			for i, n := range sizes {
				if _, err := w.Write(piece(i, n)); err != nil {
					return
				}
				if err := rc.Flush(); err != nil {
					return
				}
				select {
				case <-acks:
				case <-r.Context().Done():
					return
				}
			}
		}))
		c, _, d := client(t, env)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.ln.URL(), nil)
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, []string{"chunked"}, resp.TransferEncoding)
		for i, n := range sizes {
			got := make([]byte, n)
			_, err := io.ReadFull(resp.Body, got)
			require.NoError(t, err, "piece %d of %d bytes", i, n)
			require.True(t, bytes.Equal(piece(i, n), got), "piece %d of %d bytes differs", i, n)
			select {
			case acks <- struct{}{}:
			case <-ctx.Done():
				t.Fatalf("handler did not wait for ack %d: %v", i, ctx.Err())
			}
		}
		rest, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Empty(t, rest)
		requireTransports(t, env, s, d, 1)
	})
}

// piece returns the i-th piece of a streamed response, n bytes long.
func piece(i, n int) []byte {
	return bytes.Repeat([]byte{byte('a' + i)}, n)
}

// TestClientCancel cancels a request while its response streams in: the client's read
// fails with context.Canceled, and the server's handler sees it and stops.
func TestClientCancel(t *testing.T) {
	const (
		chunk = 32 << 10
		limit = 1 << 30 // the handler would stop here; it must stop long before
	)
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		type outcome struct {
			sent   int64
			ctxErr error
		}
		handled := make(chan outcome, 1)
		s := serve(t, env, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			buf := bytes.Repeat([]byte("x"), chunk)
			var sent int64
			for sent < limit && r.Context().Err() == nil {
				if _, err := w.Write(buf); err != nil {
					break
				}
				if err := rc.Flush(); err != nil {
					break
				}
				sent += chunk
			}
			<-r.Context().Done() // ends when the connection does, whatever stopped the loop
			handled <- outcome{sent, r.Context().Err()}
		}))
		c, _, d := client(t, env)

		reqCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, s.ln.URL(), nil)
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, err = io.ReadFull(resp.Body, make([]byte, 1<<20))
		require.NoError(t, err)
		cancel()
		_, err = io.Copy(io.Discard, resp.Body)
		require.ErrorIs(t, err, context.Canceled)

		select {
		case o := <-handled:
			require.Less(t, o.sent, int64(limit), "the handler wrote everything; the cancel never reached it")
			require.ErrorIs(t, o.ctxErr, context.Canceled)
		case <-ctx.Done():
			t.Fatal("the handler did not end after the client canceled")
		}
		requireTransports(t, env, s, d, 1)
	})
}

// TestShutdownInFlight shuts the server down while requests are in its handlers: the
// server stops listening and closes its idle connections at once, lets the requests
// finish, closes their connections and then returns.
func TestShutdownInFlight(t *testing.T) {
	const inFlight = 6
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		started := make(chan struct{}, inFlight)
		release := make(chan struct{})
		s := serve(t, env, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				started <- struct{}{}
				<-release
			}
			fmt.Fprintf(w, "done %s", r.URL.Path)
		}))

		// A client whose one connection is idle when the shutdown begins.
		idle, _, _ := client(t, env)
		_, err := get(ctx, idle, s.ln.URL()+"/warmup")
		require.NoError(t, err)
		idleConn := s.ln.Conns()[0]

		c, _, d := client(t, env)
		results := make(chan error, inFlight)
		for range inFlight {
			go func() {
				body, err := get(ctx, c, s.ln.URL()+"/slow")
				if err == nil && body != "done /slow" {
					err = fmt.Errorf("body %q", body)
				}
				results <- err
			}()
		}
		for range inFlight {
			<-started
		}
		shutdown := make(chan error, 1)
		go func() { shutdown <- s.Shutdown(ctx) }()
		select { // Shutdown closes the listener and then the idle connection
		case <-idleConn.Closed():
		case <-ctx.Done():
			t.Fatal("Shutdown did not close the idle connection")
		}
		select {
		case err := <-shutdown:
			t.Fatalf("Shutdown returned (%v) with %d requests in flight", err, inFlight)
		default:
		}
		close(release)
		for range inFlight {
			require.NoError(t, <-results)
		}
		require.NoError(t, <-shutdown)
		require.ErrorIs(t, s.wait(), http.ErrServerClosed)
		require.Len(t, s.ln.Conns(), inFlight+1, "connections accepted: one idle, one per request in flight")
		requireTransports(t, env, s, d, inFlight+1)
	})
}

// TestPlainClient serves a stock http.Client, which knows nothing of rsock, next to an
// rsock client, from one Listener with AcceptPlainClients.
func TestPlainClient(t *testing.T) {
	harness.ForEachTransport(t, func(t *testing.T, env *harness.Env) {
		ctx := harness.Context(t)
		env.Server.AcceptPlainClients = true
		s := serve(t, env, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello %s", rsockhttp.ConnTransport(r))
		}))
		plainTransport := &http.Transport{}
		defer plainTransport.CloseIdleConnections()
		plain := &http.Client{Transport: plainTransport}
		rc, _, d := client(t, env)

		for range 2 {
			body, err := get(ctx, plain, s.ln.URL())
			require.NoError(t, err)
			require.Equal(t, "hello tcp", body)
			body, err = get(ctx, rc, s.ln.URL())
			require.NoError(t, err)
			require.Equal(t, "hello "+env.Want, body)
		}

		harness.RequireTransport(t, env.Want, d.Conns(), 1, "rsock client")
		var plains, rsocks int
		for _, c := range s.ln.Conns() {
			if errors.Is(c.FallbackReason(), rsock.ErrPlainClient) {
				plains++
				require.Equal(t, rsock.TransportTCP, c.Transport(), "plain client's connection")
				continue
			}
			rsocks++
			require.Equal(t, env.Want, c.Transport(), "rsock client's connection: %v", c.FallbackReason())
		}
		require.Equal(t, 1, plains, "plain connections accepted")
		require.Equal(t, 1, rsocks, "rsock connections accepted")
	})
}

package workload

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
)

// maxHTTPBody bounds the body the server sends: GET /<n> answers n zero bytes.
const maxHTTPBody = 1 << 20

var httpBody = make([]byte, maxHTTPBody)

// httpHandler serves GET /<n> with an n-byte body.
func httpHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Path[1:])
		if err != nil || n < 0 || n > maxHTTPBody {
			http.Error(w, "want GET /<size>", http.StatusNotFound)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.Itoa(n))
		w.Write(httpBody[:n])
	})
}

// runHTTP has p.Conns callers GET p.Size-byte bodies through one http.Transport, which
// keeps up to p.Conns connections alive.
func runHTTP(ctl Control, env *Env, p Params) (Metrics, error) {
	if p.Size > maxHTTPBody {
		return Metrics{}, fmt.Errorf("http: body of %d bytes is over %d", p.Size, maxHTTPBody)
	}
	conc := max(p.Conns, 1)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return env.open(ctx, roleHTTP, 0)
		},
		MaxIdleConns:        conc,
		MaxIdleConnsPerHost: conc,
		MaxConnsPerHost:     conc,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	url := "http://rsockperf/" + strconv.Itoa(p.Size)
	get := func(int) error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return err
		case resp.StatusCode != http.StatusOK || n != int64(p.Size):
			return fmt.Errorf("GET %s: %s with %d bytes", url, resp.Status, n)
		}
		return nil
	}
	if err := get(0); err != nil { // warm up: one connection and the handler
		return Metrics{}, err
	}
	if err := fanOut(ctl, conc, get); err != nil {
		return Metrics{}, err
	}
	return Metrics{BytesPerOp: int64(p.Size)}, nil
}

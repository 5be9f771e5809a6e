// Command client is a stock net/http client whose connections are dialed through
// rsock. It GETs the server's page a few times (on one kept-alive connection), uploads
// a body and checks the server's SHA-256 of it, and prints which transport carried
// each request.
//
//	go run ./examples/http/server      # in another terminal
//	go run ./examples/http/client -url http://127.0.0.1:8080 -n 3 -upload 64
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"time"

	rsockhttp "github.com/rsockio/rsock/http"
	"github.com/rsockio/rsock/rsock"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8080", "the server's URL")
	n := flag.Int("n", 3, "how many GET requests to make")
	upload := flag.Int("upload", 16, "MiB to upload to /sha256 (0: none)")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A nil Config: RDMA when both ends have a device, TCP otherwise.
	if err := run(ctx, *url, nil, *n, *upload<<20, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run makes n GET requests to url and one POST of size bytes to url/sha256.
func run(ctx context.Context, url string, cfg *rsock.Config, n, size int, out io.Writer) error {
	client := rsockhttp.NewClient(cfg) // an *http.Client; its dials go through rsock
	defer client.CloseIdleConnections()

	for range n {
		body, err := do(ctx, client, http.MethodGet, url+"/", nil, out)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "GET /: %s", body)
	}
	if size == 0 {
		return nil
	}
	data := strings.Repeat("rsock", size/5+1)[:size]
	start := time.Now()
	body, err := do(ctx, client, http.MethodPost, url+"/sha256", strings.NewReader(data), out)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	want := fmt.Sprintf("%d %x\n", size, sha256.Sum256([]byte(data)))
	if body != want {
		return fmt.Errorf("POST /sha256: the server says %q, want %q", body, want)
	}
	fmt.Fprintf(out, "POST /sha256: %d MiB in %v (%.0f MB/s), the server's SHA-256 matches\n",
		size>>20, elapsed.Round(time.Millisecond), float64(size)/elapsed.Seconds()/1e6)
	return nil
}

// do makes one request and returns the response body. An httptrace hook prints the
// connection the request went on: the net.Conn it gets is the *rsock.Conn that
// rsock's dialer returned.
func do(ctx context.Context, client *http.Client, method, url string, body io.Reader, out io.Writer) (string, error) {
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if c, ok := info.Conn.(*rsock.Conn); ok && !info.Reused {
			fmt.Fprintf(out, "new connection to %s over %s\n", c.RemoteAddr(), c.Transport())
			if why := c.FallbackReason(); why != nil {
				fmt.Fprintf(out, "not rdma: %v\n", why)
			}
		}
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, url, body)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", method, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s %s: %s", method, url, resp.Status)
	}
	return string(b), nil
}

package rsock_test

import (
	"bufio"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"

	"github.com/rsockio/rsock/rsock"
)

func Example() {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() { // an upper-casing line server
		for {
			c, err := ln.AcceptRsock()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintln(c, strings.ToUpper(sc.Text()))
				}
			}()
		}
	}()

	c, err := rsock.Dial("tcp", ln.Addr().String(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "hello")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(line)
	// Here both ends are on one host, so c.Transport() is "shm" (shared memory).
	// Between hosts that both have an RDMA device (a build with -tags rdma on such a
	// machine), it is "rdma"; elsewhere it is "tcp", and c.FallbackReason() says why,
	// e.g. an error matching rsock.ErrNoProvider.
	if c.Transport() == rsock.TransportTCP && c.FallbackReason() == nil {
		fmt.Println("a fallback without a reason")
	}
	// Output:
	// HELLO
}

// A net/http server and client over rsock.
func ExampleDialer_DialContext() {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", nil)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "served over rsock")
	})}
	go srv.Serve(ln)
	defer srv.Close()

	tr := &http.Transport{DialContext: (&rsock.Dialer{}).DialContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var body strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&body)
	fmt.Println(body.String())
	// Output: served over rsock
}

// A Listener that also serves clients speaking no rsock hello.
func ExampleConfig_acceptPlainClients() {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0", &rsock.Config{AcceptPlainClients: true})
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptRsock()
		if err != nil {
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Println(errors.Is(c.FallbackReason(), rsock.ErrPlainClient))
		fmt.Fprintf(c, "%s client said %s", c.Transport(), line)
	}()

	c, err := net.Dial("tcp", ln.Addr().String()) // a plain TCP client
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "hi")
	line, _ := bufio.NewReader(c).ReadString('\n')
	fmt.Print(line)
	// Output:
	// true
	// tcp client said hi
}

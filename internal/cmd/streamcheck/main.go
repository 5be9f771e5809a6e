// Command streamcheck moves a verified byte stream both ways over one rsock connection
// until the connection fails, and reports what each side wrote and read and how it
// ended. The .ci/rxe guest runs it on its two hosts and takes a host's netdev down
// mid-stream (.ci/rxe-guest/events.sh): both ends must fail with a named error, soon,
// and each reader must have received a verified prefix of what its peer wrote.
//
//	streamcheck -listen 10.77.1.2:7600     # host B: accept one connection
//	streamcheck -dial 10.77.1.2:7600       # host A
//	streamcheck -now                       # print the clock, as the reports do
//
// With -idle, each side stops writing once a MiB has crossed each way, and only reads:
// the connection is idle when the fault strikes, so only a probe, an event or the
// control channel can tell it (its Write half then reports the error of one more
// Write, made once the Read half has ended).
//
// Each side prints "transport rdma" (or what carries it), "streaming" once a MiB has
// crossed each way, and at the end one line:
//
//	result wrote=N read=M write_err_ms=T read_err_ms=T write_err="..." read_err="..."
//
// wrote is what Write reported written, read what Read returned and was verified
// (a byte that differs from the peer's stream ends the check with "corrupt"), and
// *_err_ms the Unix time in milliseconds at which each half ended.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/rsockio/rsock/rsock"
)

func main() {
	listen := flag.String("listen", "", "accept one connection on this address")
	dial := flag.String("dial", "", "dial this address")
	now := flag.Bool("now", false, "print the Unix time in milliseconds and exit")
	keepalive := flag.Duration("keepalive", time.Second, "rsock keepalive period")
	limit := flag.Duration("limit", 2*time.Minute, "give up after this long")
	idle := flag.Bool("idle", false, "stop writing after the first MiB: wait idle for the connection to end")
	flag.Parse()
	if *now {
		fmt.Println(time.Now().UnixMilli())
		return
	}
	cfg := &rsock.Config{KeepAlive: *keepalive}
	ctx, cancel := context.WithTimeout(context.Background(), *limit)
	defer cancel()
	c, err := connect(ctx, *listen, *dial, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "streamcheck:", err)
		os.Exit(1)
	}
	server := *listen != ""
	r := run(ctx, c, server, *idle, os.Stdout)
	fmt.Println(r)
	if r.corrupt {
		os.Exit(1)
	}
}

// connect accepts one connection on listen, or dials dial.
func connect(ctx context.Context, listen, dial string, cfg *rsock.Config) (*rsock.Conn, error) {
	switch {
	case listen != "" && dial == "":
		ln, err := rsock.Listen("tcp", listen, cfg)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		return ln.AcceptRsock()
	case dial != "" && listen == "":
		d := &rsock.Dialer{Config: cfg}
		c, err := d.DialContext(ctx, "tcp", dial)
		if err != nil {
			return nil, err
		}
		return c.(*rsock.Conn), nil
	}
	return nil, errors.New("give one of -listen and -dial")
}

// result is how one side's stream ended.
type result struct {
	wrote, read       int64
	writeErr, readErr error
	writeAt, readAt   time.Time
	corrupt           bool
}

func (r result) String() string {
	return fmt.Sprintf("result wrote=%d read=%d write_err_ms=%d read_err_ms=%d write_err=%q read_err=%q",
		r.wrote, r.read, r.writeAt.UnixMilli(), r.readAt.UnixMilli(), errText(r.writeErr), errText(r.readErr))
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Seeds of the two directions' streams.
const (
	clientSeed = 1
	serverSeed = 2
)

// streamingAt is how many bytes must cross each way before "streaming" is printed.
const streamingAt = 1 << 20

// run writes this side's stream and reads and verifies the peer's, both until the
// connection fails or ctx ends, and prints progress to out. With idle, it stops writing
// after streamingAt bytes and waits for the Read half to end before one last Write.
func run(ctx context.Context, c *rsock.Conn, server, idle bool, out io.Writer) result {
	fmt.Fprintln(out, "transport", c.Transport())
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	mine, theirs := uint64(clientSeed), uint64(serverSeed)
	if server {
		mine, theirs = theirs, mine
	}
	var r result
	var mu sync.Mutex
	announced := false
	progress := func() { // called with mu held
		if !announced && r.wrote >= streamingAt && r.read >= streamingAt {
			announced = true
			fmt.Fprintln(out, "streaming")
		}
	}
	var wg sync.WaitGroup
	readDone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(readDone)
		want := rand.NewChaCha8(seed(theirs))
		buf, exp := make([]byte, 64<<10), make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			want.Read(exp[:n])
			mu.Lock()
			if string(buf[:n]) != string(exp[:n]) {
				r.corrupt, r.readErr, r.readAt = true, fmt.Errorf("corrupt: bytes %d to %d differ from the peer's stream", r.read, r.read+int64(n)), time.Now()
				mu.Unlock()
				c.Close()
				return
			}
			r.read += int64(n)
			progress()
			if err != nil {
				r.readErr, r.readAt = err, time.Now()
				mu.Unlock()
				return
			}
			mu.Unlock()
		}
	}()
	src := rand.NewChaCha8(seed(mine))
	buf := make([]byte, 32<<10)
	for {
		mu.Lock()
		quiet := idle && r.wrote >= streamingAt
		mu.Unlock()
		if quiet {
			<-readDone
		}
		src.Read(buf)
		n, err := c.Write(buf)
		mu.Lock()
		r.wrote += int64(n)
		progress()
		if err != nil {
			r.writeErr, r.writeAt = err, time.Now()
			mu.Unlock()
			break
		}
		mu.Unlock()
	}
	wg.Wait()
	c.Close()
	return r
}

func seed(s uint64) [32]byte {
	var b [32]byte
	for i := range 8 {
		b[i] = byte(s >> (8 * i))
	}
	return b
}

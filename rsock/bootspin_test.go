package rsock

import (
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs/soft"
)

// pipeBoot is one end of a net.Pipe as a bootConn: a connection with no socket under it.
type pipeBoot struct{ net.Conn }

func (pipeBoot) CloseWrite() error { return nil }

// spinPair returns both ends of a loopback TCP connection (hello_test.go's tcpPair),
// closed with the test.
func spinPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, s := tcpPair(t, ln)
	t.Cleanup(func() {
		c.Close()
		s.Close()
	})
	return c, s
}

func TestSpinsOf(t *testing.T) {
	for _, tt := range []struct{ pollSpin, want int }{
		{-1, 0},
		{0, rdma.DefaultPollSpin},
		{1, 1},
		{500, 500},
	} {
		if got := spinsOf(tt.pollSpin); got != tt.want {
			t.Errorf("spinsOf(%d) = %d, want %d", tt.pollSpin, got, tt.want)
		}
	}
}

// TestBootSpinRead reads what a bootstrap connection has with and without polling, and
// checks that the polling serves a Read whose bytes are there, and that the
// connection's own Read reports what ends a stream, as without polling.
func TestBootSpinRead(t *testing.T) {
	for _, tt := range []struct {
		name     string
		pollSpin int
		pipe     bool // a connection with no socket: never polled
		send     string
		close    bool // the peer closes after sending
		expired  bool // the read deadline has passed
		want     string
		wantErr  error
		wantHits int // at least; 0 with no polling or an error: none
	}{
		// The spins end with the first bytes; many, in case loopback delivers late.
		{name: "buffered", pollSpin: 1 << 20, send: "hello", want: "hello", wantHits: 1},
		{name: "default spin", send: "hi", want: "hi"},
		{name: "spin off", pollSpin: -1, send: "hello", want: "hello"},
		{name: "buffered then closed", pollSpin: 1 << 20, send: "x", close: true, want: "x", wantHits: 1},
		{name: "closed", close: true, wantErr: io.EOF},
		{name: "deadline passed", send: "late", expired: true, wantErr: os.ErrDeadlineExceeded},
		{name: "no socket", pipe: true, send: "pipe", want: "pipe"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var conn bootConn
			var peer net.Conn
			if tt.pipe {
				a, b := net.Pipe()
				t.Cleanup(func() {
					a.Close()
					b.Close()
				})
				conn, peer = pipeBoot{a}, b
			} else {
				conn, peer = spinPair(t)
			}
			sent := make(chan error, 1)
			go func() { // a pipe's Write waits for the Read
				_, err := io.WriteString(peer, tt.send)
				if tt.close {
					peer.Close()
				}
				sent <- err
			}()
			if !tt.pipe {
				require.NoError(t, <-sent) // in the socket before the Read
			}
			if tt.expired {
				require.NoError(t, conn.SetReadDeadline(time.Unix(1, 0)))
			}
			var s bootSpin
			s.init(conn, tt.pollSpin)
			buf := make([]byte, 16)
			n, err := s.Read(buf)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			if tt.want != "" && n < len(tt.want) { // TCP may split what was sent
				m, err := io.ReadFull(&s, buf[n:len(tt.want)])
				require.NoError(t, err)
				n += m
			}
			require.Equal(t, tt.want, string(buf[:n]), "bytes read")
			switch {
			case tt.wantHits > 0:
				require.GreaterOrEqual(t, s.hits, tt.wantHits, "Reads the polling served")
			case tt.pollSpin < 0 || tt.pipe || tt.wantErr != nil:
				require.Zero(t, s.hits, "Reads the polling served")
			}
			if tt.pipe {
				require.NoError(t, <-sent)
			}
		})
	}
}

// TestBootSpinReadWaits reads with a spin of one try before the bytes are sent: the
// Read blocks in the connection's own Read and returns them once they come.
func TestBootSpinReadWaits(t *testing.T) {
	c, s := spinPair(t)
	var r bootSpin
	r.init(c, 1)
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 8)
		n, err := io.ReadFull(&r, buf[:5])
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf[:n])
	}()
	_, err := io.WriteString(s, "later")
	require.NoError(t, err)
	require.Equal(t, "later", <-got)
}

// TestHandshakePollSpin upgrades with the handshake's polling of the bootstrap
// connection off, at one try, and at the default, on each side, and moves bytes both
// ways: the polling changes when the answers are read, never what.
func TestHandshakePollSpin(t *testing.T) {
	for _, tt := range []struct{ server, client int }{
		{-1, -1}, {-1, 0}, {0, -1}, {1, 1}, {0, 0},
	} {
		t.Run(fmt.Sprintf("server=%d,client=%d", tt.server, tt.client), func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
			scfg.PollSpin, ccfg.PollSpin = tt.server, tt.client
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
			require.Equal(t, TransportRDMA, s.Transport(), "server: %v", s.FallbackReason())
			for _, dir := range []struct{ w, r *Conn }{{c, s}, {s, c}} {
				_, err := io.WriteString(dir.w, "ping")
				require.NoError(t, err)
				buf := make([]byte, 4)
				_, err = io.ReadFull(dir.r, buf)
				require.NoError(t, err)
				require.Equal(t, "ping", string(buf))
			}
			require.NoError(t, c.Close())
			require.NoError(t, s.Close())
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}

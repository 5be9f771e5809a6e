package rsock

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// closeCase is a transport the close contract is checked on, with the Configs that
// give it.
type closeCase struct {
	transport string
	configs   func(t *testing.T) (server, client *Config)
	runs      int // of the Write-racing-Close test
}

func closeCases() []closeCase {
	fab := soft.New(soft.Options{})
	return []closeCase{
		{TransportTCP, func(t *testing.T) (*Config, *Config) { return plainConfigs(t, FallbackTCP) }, 20},
		{TransportQUIC, func(t *testing.T) (*Config, *Config) { return plainConfigs(t, FallbackQUIC) }, 5},
		{TransportRDMA, func(t *testing.T) (*Config, *Config) { return rdmaConfigs(t, FallbackTCP, fab) }, 5},
		{TransportRDMATLS, func(t *testing.T) (*Config, *Config) {
			s, c := configs(t, FallbackQUIC)
			s.Provider, c.Provider = fab, fab
			return s, c
		}, 5},
	}
}

// sides runs f with the client's and the server's end of a new connection as c (the
// end under test) and peer.
func sides(t *testing.T, ln *Listener, cfg *Config, transport string, f func(side string, c, peer *Conn)) {
	t.Helper()
	for _, side := range []string{"client", "server"} {
		cl, s := pipe(t, ln, cfg)
		require.Equal(t, transport, cl.Transport(), "client: %v", cl.FallbackReason())
		c, peer := cl, s
		if side == "server" {
			c, peer = s, cl
		}
		f(side, c, peer)
		peer.Close()
	}
}

// TestCloseContract checks what net.Conn's methods return after Close, on every
// transport and both ends: the first Close reports how it went (nil here), and a
// second Close, the deadline setters, Read and Write return errors matching
// net.ErrClosed, as a *net.TCPConn's do.
func TestCloseContract(t *testing.T) {
	for _, tc := range closeCases() {
		t.Run(tc.transport, func(t *testing.T) {
			scfg, ccfg := tc.configs(t)
			ln := listen(t, scfg)
			sides(t, ln, ccfg, tc.transport, func(side string, c, _ *Conn) {
				require.NoError(t, c.Close(), "%s: first Close", side)
				calls := []struct {
					name string
					call func() error
				}{
					{"second Close", c.Close},
					{"SetDeadline", func() error { return c.SetDeadline(time.Now().Add(time.Hour)) }},
					{"SetReadDeadline", func() error { return c.SetReadDeadline(time.Time{}) }},
					{"SetWriteDeadline", func() error { return c.SetWriteDeadline(time.Time{}) }},
					{"Read", func() error { _, err := c.Read(make([]byte, 1)); return err }},
					{"Write", func() error { _, err := c.Write([]byte("x")); return err }},
				}
				for _, call := range calls {
					require.ErrorIs(t, call.call(), net.ErrClosed, "%s: %s after Close", side, call.name)
				}
			})
		})
	}
}

// TestWriteRacingClose closes a Conn while another goroutine's Write is in progress on
// it, on every transport and both ends: the Write fails with an error matching
// net.ErrClosed. The Write is larger than what the peer, which reads one byte and
// stops, and the transport can absorb, so Close finds it in the middle, most often
// blocked. On a TCP client whose server answer was still unread, Close used to
// half-close the socket before closing it, and the Write failed with EPIPE ("write:
// broken pipe") instead.
func TestWriteRacingClose(t *testing.T) {
	big := make([]byte, 16<<20)
	for _, tc := range closeCases() {
		t.Run(tc.transport, func(t *testing.T) {
			scfg, ccfg := tc.configs(t)
			ln := listen(t, scfg)
			for range tc.runs {
				sides(t, ln, ccfg, tc.transport, func(side string, c, peer *Conn) {
					done := make(chan error, 1)
					go func() {
						_, err := c.Write(big)
						done <- err
					}()
					_, err := io.ReadFull(peer, make([]byte, 1)) // the Write has begun
					require.NoError(t, err)
					c.Close()
					require.ErrorIs(t, <-done, net.ErrClosed, "%s: Write racing Close", side)
				})
			}
		})
	}
}

package rsock

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/testfiles"
)

// TestOutOfFiles: a process out of file descriptors, with 0, 1, 2 … of them left
// while it dials a Listener of its own on this host. Each connection that opens works,
// on shared memory (or, with shared memory disabled, on the default provider's device
// where there is one: rxe in the CI's VM) or, where the files ran out on the way, on
// TCP with a reason that says so; a dial that fails says so, or times out waiting for
// the Listener, which could not accept for want of files either. Once the descriptors are
// back, a connection gets the faster transport again: no failure on the way was kept.
// It runs in a child process, whose descriptor limit it lowers.
func TestOutOfFiles(t *testing.T) {
	if !inChild(t) {
		return
	}
	testfiles.Limit(t, 512)
	// A short handshake: where the files ran out under the peer's proof, the client
	// waits half of it for the proof before it falls back.
	sweeps := []struct {
		name string
		cfg  *Config
		want string
	}{
		{"shared memory", &Config{HandshakeTimeout: 2 * time.Second}, TransportSHM},
		{"default provider", &Config{HandshakeTimeout: 2 * time.Second, DisableSHM: true}, TransportRDMA},
	}
	for _, sw := range sweeps {
		t.Run(sw.name, func(t *testing.T) {
			if sw.want == TransportRDMA {
				// Found before the sweep, and then kept: a probe that fails for want of
				// files is retried only after auto.RetryInterval (verbs/auto's tests).
				if _, err := defaultProvider(); err != nil {
					t.Skipf("no default provider here: %v", err)
				}
			}
			for free := range 24 {
				outcome := outOfFilesDial(t, sw.cfg, free)
				t.Logf("%d free: %s", free, outcome)
			}
			ln := listen(t, sw.cfg)
			c, s := pipe(t, ln, sw.cfg)
			defer c.Close()
			defer s.Close()
			require.Equal(t, sw.want, c.Transport(), "with descriptors back: %v", c.FallbackReason())
			require.Equal(t, sw.want, s.Transport(), "with descriptors back: %v", s.FallbackReason())
			requireEcho(t, c, s)
		})
	}
}

// outOfFilesDial dials a new Listener with only free descriptors left to the process,
// checks what it got, and says what that was.
func outOfFilesDial(t *testing.T, cfg *Config, free int) string {
	ln := listen(t, cfg)
	defer ln.Close()
	accepted := make(chan *Conn, 1)
	go func() {
		s, err := ln.AcceptRsock()
		if err != nil {
			s = nil
		}
		accepted <- s
	}()
	release := testfiles.Take(t, free)
	c, err := Dial("tcp", ln.Addr().String(), cfg)
	release()
	if err != nil {
		// Either this side ran out, or the Listener, in this process too, could not
		// accept (accept4: EMFILE, retried) until the client's handshake timed out: a
		// client elsewhere cannot know why a server does not answer.
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			require.ErrorContains(t, err, "too many open files", "%d free", free)
		}
		ln.Close()
		<-accepted
		return "dial failed: " + err.Error()
	}
	defer c.Close()
	s := <-accepted
	require.NotNil(t, s, "%d free: the Listener accepts the dialed connection", free)
	defer s.Close()
	requireEcho(t, c, s)
	for side, conn := range map[string]*Conn{"client": c, "server": s} {
		if tr := conn.Transport(); tr != TransportSHM && tr != TransportRDMA {
			require.Error(t, conn.FallbackReason(), "%d free: %s on %s", free, side, conn.Transport())
			why := conn.FallbackReason().Error()
			require.True(t, strings.Contains(why, "too many open files") || strings.Contains(why, "RLIMIT_NOFILE") ||
				strings.Contains(why, "peer offered no RDMA") || strings.Contains(why, "peer declined"),
				"%d free: the %s's reason names the cause, or the peer's: %s", free, side, why)
		}
	}
	return fmt.Sprintf("client %s (%v), server %s (%v)", c.Transport(), c.FallbackReason(), s.Transport(), s.FallbackReason())
}

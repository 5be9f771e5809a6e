package rsock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
)

// shmEchoEnv, in a re-executed test binary's environment, makes it an rsock echo server
// for TestSHMTwoProcesses: it listens on loopback with the default Config, prints its
// address, echoes one connection and exits.
const shmEchoEnv = "RSOCK_SHM_ECHO"

// runSHMEchoIfAsked runs the echo server and reports true if this process is one.
func runSHMEchoIfAsked() bool {
	if os.Getenv(shmEchoEnv) == "" {
		return false
	}
	if err := shmEcho(); err != nil {
		fmt.Fprintln(os.Stderr, "shm echo server:", err)
		os.Exit(1)
	}
	return true
}

func shmEcho() error {
	ln, err := Listen("tcp", "127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println(ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	if tr := c.(*Conn).Transport(); tr != TransportSHM {
		return fmt.Errorf("accepted a connection over %s (%v)", tr, c.(*Conn).FallbackReason())
	}
	if _, err := io.Copy(c, c); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// TestSHMTwoProcesses: a client and a server in two processes of this host, with the
// default Config, connect over shared memory, and bytes cross both ways intact.
func TestSHMTwoProcesses(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), shmEchoEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the server's address (stderr: %s)", &stderr)

	c, err := Dial("tcp", strings.TrimSpace(line), nil)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, TransportSHM, c.Transport(), "fallback reason: %v", c.FallbackReason())

	want := make([]byte, 4<<20)
	for i := range want {
		want[i] = byte(i*7 + i>>10)
	}
	got := make([]byte, len(want))
	read := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(c, got)
		read <- err
	}()
	_, err = c.Write(want)
	require.NoError(t, err)
	require.NoError(t, <-read)
	require.True(t, bytes.Equal(want, got), "echoed bytes differ")
	require.NoError(t, c.CloseWrite())
	require.NoError(t, cmd.Wait(), "the server (stderr: %s)", &stderr)
}

// TestSHMSelection: which side's Config keeps a same-host connection off shared memory,
// and the reason each side then gives; a memory limit that the same-host ring is over
// gets the ordinary ring on shared memory instead.
func TestSHMSelection(t *testing.T) {
	tests := []struct {
		name           string
		server, client *Config
		want           string // "": not shm (TCP, or RDMA where a default provider has a device)
		reason         error  // the client's
	}{
		{"Default", nil, nil, TransportSHM, nil},
		{"ClientDisables", nil, &Config{DisableSHM: true}, "", nil},
		{"ServerDisables", &Config{DisableSHM: true}, nil, TransportTCP, ErrNoProvider},
		{"ClientDisablesRDMA", nil, &Config{DisableRDMA: true}, TransportTCP, ErrNoProvider},
		// The same-host ring is over these memory limits; the ordinary one is not.
		{"ServerBudgetSmall", &Config{MaxRegisteredMemoryPerRemote: 1 << 20}, nil, TransportSHM, nil},
		{"ClientBudgetSmall", nil, &Config{MaxRegisteredMemory: 1 << 20}, TransportSHM, nil},
		// Not even the ordinary ring fits.
		{"ServerBudgetTiny", &Config{MaxRegisteredMemoryPerRemote: 4 << 10}, nil, TransportTCP, ErrResourcesExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln := listen(t, tt.server)
			accepted := make(chan *Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					accepted <- nil
					return
				}
				accepted <- c.(*Conn)
			}()
			c, err := Dial("tcp", ln.Addr().String(), tt.client)
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Write([]byte("ping"))
			require.NoError(t, err)
			s := <-accepted
			require.NotNil(t, s)
			defer s.Close()
			buf := make([]byte, 4)
			_, err = io.ReadFull(s, buf)
			require.NoError(t, err)
			require.Equal(t, "ping", string(buf))
			if tt.want == "" {
				require.NotEqual(t, TransportSHM, c.Transport(), "client transport")
				require.Equal(t, c.Transport(), s.Transport(), "server transport (reason %v)", s.FallbackReason())
				return
			}
			require.Equal(t, tt.want, c.Transport(), "client transport (reason %v)", c.FallbackReason())
			require.Equal(t, tt.want, s.Transport(), "server transport (reason %v)", s.FallbackReason())
			if tt.reason != nil {
				require.ErrorIs(t, c.FallbackReason(), tt.reason)
			} else {
				require.NoError(t, c.FallbackReason())
			}
		})
	}
}

// TestSHMLargeRingHalf: a Listener gives same-host connections the large ring only while
// their registered memory stays within half of its limit; the connections after that
// get the ordinary ring, still on shared memory, rather than using up the limit and
// falling back to TCP.
func TestSHMLargeRingHalf(t *testing.T) {
	large := int64(sameHostRingSize + sameHostSendBuffer)
	ln := listen(t, &Config{MaxRegisteredMemoryPerRemote: 2*large + large/2})
	var conns []*Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i, wantLarge := range []bool{true, false, false, false} {
		before, _, _ := ln.budget.held(netip.Prefix{})
		c, s := pipe(t, ln, nil)
		conns = append(conns, c, s)
		require.Equal(t, TransportSHM, s.Transport(), "connection %d: %v", i, s.FallbackReason())
		after, _, _ := ln.budget.held(netip.Prefix{})
		charged := after.bytes - before.bytes
		if wantLarge {
			require.GreaterOrEqual(t, charged, large, "connection %d: the large ring", i)
		} else {
			require.Less(t, charged, int64(sameHostSendBuffer), "connection %d: the ordinary ring", i)
		}
		requireEcho(t, c, s)
	}
}

// TestSameHost: which bootstrap peers are on this host.
func TestSameHost(t *testing.T) {
	tcp := func(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }
	tests := []struct {
		local, remote string
		want          bool
	}{
		{"127.0.0.1:1", "127.0.0.1:2", true},
		{"127.0.0.1:1", "127.0.0.2:2", true},
		{"[::1]:1", "[::1]:2", true},
		{"10.0.0.1:1", "10.0.0.1:2", true},
		{"10.0.0.1:1", "10.0.0.2:2", false},
		{"[::ffff:10.0.0.1]:1", "10.0.0.1:2", true},
	}
	for _, tt := range tests {
		got := sameHost(fakeBoot{local: tcp(tt.local), remote: tcp(tt.remote)})
		require.Equal(t, tt.want, got, "sameHost(%s → %s)", tt.local, tt.remote)
	}
}

// fakeBoot is a bootstrap connection that has only addresses.
type fakeBoot struct {
	bootConn
	local, remote net.Addr
}

func (f fakeBoot) LocalAddr() net.Addr  { return f.local }
func (f fakeBoot) RemoteAddr() net.Addr { return f.remote }

// TestSameHostOptions: a same-host connection has a fixed ring and a staging buffer
// larger than the RDMA defaults, unless the Config sets its own sizes, and never an ACK
// timeout.
func TestSameHostOptions(t *testing.T) {
	tests := []struct {
		name     string
		in, want rdma.Options
	}{
		{"Defaults", rdma.Options{}, rdma.Options{RingSize: sameHostRingSize, SendBufferSize: sameHostSendBuffer, NoACKTimeout: true}},
		{"FixedRing", rdma.Options{RingSize: 256 << 10}, rdma.Options{RingSize: 256 << 10, SendBufferSize: sameHostSendBuffer, NoACKTimeout: true}},
		{"OwnGrowth", rdma.Options{GrowRingTo: 32 << 10}, rdma.Options{GrowRingTo: 32 << 10, SendBufferSize: sameHostSendBuffer, NoACKTimeout: true}},
		{"OwnStaging", rdma.Options{SendBufferSize: 4 << 10}, rdma.Options{RingSize: sameHostRingSize, SendBufferSize: 4 << 10, NoACKTimeout: true}},
		{"OwnFirstRing", rdma.Options{RingSize: 16 << 10}, rdma.Options{RingSize: 16 << 10, SendBufferSize: sameHostSendBuffer, NoACKTimeout: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, sameHostOptions(tt.in), "sameHostOptions(%+v)", tt.in)
		})
	}
}

// TestSHMOutOfFiles: a same-host connection whose QP cannot reach its peer's socket (a
// process out of file descriptors; here, an injected failure of the same-host
// provider's next connection) falls back to TCP, and the side that failed says why in
// its reason, not only that the peer did not answer; the bytes cross on TCP.
func TestSHMOutOfFiles(t *testing.T) {
	p, err := auto.SameHost()
	require.NoError(t, err)
	faults, ok := p.(interface{ FailAllocs(string, int) error })
	require.True(t, ok, "the same-host provider injects faults")
	ln := listen(t, nil)
	require.NoError(t, faults.FailAllocs("dial", 1))
	t.Cleanup(func() { faults.FailAllocs("dial", 0) })
	c, s := pipe(t, ln, nil)
	defer c.Close()
	defer s.Close()
	require.Equal(t, TransportTCP, c.Transport(), "client: %v", c.FallbackReason())
	require.Equal(t, TransportTCP, s.Transport(), "server: %v", s.FallbackReason())
	require.ErrorIs(t, c.FallbackReason(), ErrPathUnproven)
	require.ErrorIs(t, c.FallbackReason(), verbs.ErrNoResources, "the client's reason names the cause")
	require.ErrorContains(t, c.FallbackReason(), "dial QP")
	require.ErrorIs(t, s.FallbackReason(), ErrPathUnproven)
	requireEcho(t, c, s)
}

// TestSHMMappingLimit sweeps rsock's share of the process's memory mappings
// (internal/vma: half of vm.max_map_count, lowered here to what it holds plus k, as a
// test cannot lower the sysctl for its process alone) through every point of a
// same-host connection's setup. Past the share, the Go runtime's own next mmap could
// be refused and the process die, so the provider is refused first: every connection
// carries bytes, on shared memory or on TCP with a reason that says so, none fails
// once it is up (a QP's connections map the peer's ring and their channels only after
// the upgrade: a refusal then failed the stream), and every mapping is given back.
func TestSHMMappingLimit(t *testing.T) {
	if !inChild(t) { // a process of its own: every mapping it holds is this test's
		return
	}
	cfg := &Config{HandshakeTimeout: 2 * time.Second}
	start := vma.Held()
	// connect connects through a Listener of its own, which leaves no spare endpoint
	// behind: the connections and the Listener close when t ends.
	connect := func(t *testing.T) (c, s *Conn) {
		ln := listen(t, cfg)
		c, s = pipe(t, ln, cfg)
		t.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	// settled waits until the connections before gave back every mapping: a closed
	// connection's goroutines unmap its channels after Close returned.
	settled := func() {
		t.Helper()
		if !assert.Eventually(t, func() bool { rdma.CloseIdle(nil); return vma.Held() == start }, 30*time.Second, time.Millisecond) {
			t.Fatalf("mappings given back: %d held, %d before", vma.Held(), start)
		}
	}
	t.Run("unbounded", func(t *testing.T) {
		c, s := connect(t)
		require.Equal(t, TransportSHM, c.Transport(), "client: %v", c.FallbackReason())
		requireEcho(t, c, s)
	})
	settled()

	const sweep = 14 // a connection reserves about 12: a ring, staging and a QP's four at each end
	onSHM := make([]bool, sweep)
	for k := range int64(sweep) {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			defer vma.SetBudget(start + k)()
			c, s := connect(t)
			requireEcho(t, c, s)
			require.Equal(t, c.Transport(), s.Transport())
			if c.Transport() == TransportSHM {
				onSHM[k] = true
				return
			}
			require.Equal(t, TransportTCP, c.Transport())
			// The side refused says why; its peer hears that it offered none, or
			// declined for want of resources.
			refused := func(reason error) bool {
				return errors.Is(reason, ErrResourcesExhausted) && errors.Is(reason, verbs.ErrNoResources) &&
					strings.Contains(reason.Error(), "vm.max_map_count")
			}
			cr, sr := c.FallbackReason(), s.FallbackReason()
			require.True(t, refused(cr) || refused(sr), "client: %v; server: %v", cr, sr)
			for _, reason := range []error{cr, sr} {
				require.True(t, refused(reason) || errors.Is(reason, ErrPeerOfferedNone) ||
					errors.Is(reason, ErrResourcesExhausted) && errors.Is(reason, ErrPeerDeclined), "%v", reason)
			}
		})
		settled()
	}
	// Below some headroom every connection is refused, from it on none is.
	enough := slices.Index(onSHM, true)
	t.Logf("a same-host connection takes %d mappings of the budget", enough)
	require.Positive(t, enough, "connections refused shared memory")
	require.NotContains(t, onSHM[enough:], false, "a connection refused with more room than one that was not")
}

// TestSHMRingGrowthUnmapsOld streams over a same-host connection whose ring grows from
// 8 KiB to 4 MiB, five rings in turn. The writer maps each ring of its peer's as it
// moves to it, and must let go of the one before: kept, every ring the peer had left
// behind stayed mapped in the writer's process, a mapping each and the ring's memory
// with it (2.7 MiB here), until the connection closed.
func TestSHMRingGrowthUnmapsOld(t *testing.T) {
	if !inChild(t) { // a process of its own: every mapping it holds is this test's
		return
	}
	cfg := &Config{RingSize: 8 << 10, GrowRingTo: 4 << 20}
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	require.Equal(t, TransportSHM, c.Transport(), "client: %v", c.FallbackReason())
	requireEcho(t, c, s)
	before := vma.Held()

	const writes, size = 400, 256 << 10
	wrote := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range writes {
			if _, err := c.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	_, err := io.CopyN(io.Discard, s, writes*size)
	require.NoError(t, err)
	require.NoError(t, <-wrote)
	require.Equal(t, 4<<20, s.Stats().RingSize, "the ring grew")
	require.Equal(t, before, vma.Held(), "mappings held after the ring grew: the old rings are unmapped")
}

// TestSHMFileSizeLimit runs, in a child process with RLIMIT_FSIZE at 1 MiB (`ulimit
// -f 1024`), a same-host connection and a stream through it. A memfd is a file, so
// the limit bounds shared memory too: the 2 MiB same-host ring is refused (EFBIG), and
// the connection takes the ordinary ring, which starts at 8 KiB, still on shared memory
// (before, it fell back to TCP), and grows only as far as the limit lets it. Every byte
// arrives, in order.
func TestSHMFileSizeLimit(t *testing.T) {
	const limit = 1 << 20
	if !inChild(t) {
		return
	}
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: limit}))
	ln := listen(t, nil)
	c, s := pipe(t, ln, nil)
	defer c.Close()
	defer s.Close()
	require.Equal(t, TransportSHM, c.Transport(), "client: %v", c.FallbackReason())
	require.Equal(t, TransportSHM, s.Transport(), "server: %v", s.FallbackReason())

	const total = 16 << 20
	wrote := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for off := 0; off < total; off += len(buf) {
			for i := range buf {
				buf[i] = byte((off + i) % 251)
			}
			if _, err := c.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	got := make([]byte, 64<<10)
	for off := 0; off < total; {
		n, err := s.Read(got)
		require.NoError(t, err)
		for i := range n {
			if got[i] != byte((off+i)%251) {
				t.Fatalf("byte %d: %d, want %d", off+i, got[i], byte((off+i)%251))
			}
		}
		off += n
	}
	require.NoError(t, <-wrote)
	st := s.Stats()
	t.Logf("ring %d bytes, staging %d", st.RingSize, c.Stats().StagingSize)
	require.LessOrEqual(t, st.RingSize, limit)
	requireEcho(t, c, s)
}

// TestSHMManyGrowingStreams: many same-host connections streaming at once through
// growing rings (Config.GrowRingTo, as a Listener gives past half its memory limits)
// all carry their bytes. A ring's growth makes the writer's QP ask for the new region
// behind unsignaled writes in flight; before verbs/shm's setStalled, the
// acknowledgements of those writes woke nobody once no Poll drove the response ring,
// and every stream stopped for good (64 connections, 2026-11-30, when a CQ's Polls
// drove 64 QPs at most). Since verbs/shm's maxDriven is 256 these CQs are driven, and
// the stall shows only where no Poll drives the ring (a CQ armed, or not polled):
// verbs/shm's TestStallBehindUnsignaled makes it there.
func TestSHMManyGrowingStreams(t *testing.T) {
	const conns, total = 72, 1 << 20
	cfg := &Config{GrowRingTo: 4 << 20}
	ln := listen(t, cfg)
	clients, servers := make([]*Conn, conns), make([]*Conn, conns)
	for i := range conns {
		clients[i], servers[i] = pipe(t, ln, cfg)
		defer clients[i].Close()
		defer servers[i].Close()
		require.Equal(t, TransportSHM, clients[i].Transport(), "client %d: %v", i, clients[i].FallbackReason())
	}
	deadline := time.Now().Add(time.Minute) // a bound on what must happen, not a timing
	errs := make(chan error, 2*conns)
	var wg sync.WaitGroup
	for i := range conns {
		c, s := clients[i], servers[i]
		require.NoError(t, c.SetDeadline(deadline))
		require.NoError(t, s.SetDeadline(deadline))
		wg.Go(func() {
			buf := make([]byte, 64<<10)
			for off := 0; off < total; off += len(buf) {
				if _, err := c.Write(buf); err != nil {
					errs <- fmt.Errorf("client %d: write at %d: %w", i, off, err)
					return
				}
			}
			if err := c.CloseWrite(); err != nil {
				errs <- fmt.Errorf("client %d: close write: %w", i, err)
			}
		})
		wg.Go(func() {
			if n, err := io.Copy(io.Discard, s); err != nil || n != total {
				errs <- fmt.Errorf("server %d: read %d bytes of %d: %v", i, n, total, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	grown := 0
	for _, s := range servers {
		if s.Stats().RingSize > rdma.DefaultRingSize {
			grown++
		}
	}
	require.NotZero(t, grown, "no ring grew: the test no longer covers a region switch")
}

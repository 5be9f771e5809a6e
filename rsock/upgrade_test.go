package rsock

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/rsock/internal/rdma"
	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/soft"
)

// This file tests the proof of the path and its binding to the bootstrap connection
// (upgrade.go, proof.go) on the soft provider: a path that carries no RoCE ends on the
// fallback transport on both sides, with nothing lost; a hello replayed, spliced, or
// followed by a confirmation without a proof, or by a proof that is not this
// connection's, never gives the server an RDMA Conn, and the Listener keeps serving.

// loopbackGID is the GID every soft test connection on 127.0.0.1 uses.
var loopbackGID = verbs.GIDFromAddr(netip.MustParseAddr("127.0.0.1"))

// bindingProviders are the providers the binding tests run on: soft, with timers scaled
// down, and the default provider where the build and the machine have one (rxe in the
// VM), each made fresh per test.
func bindingProviders(t *testing.T) map[string]func() verbs.Provider {
	ps := map[string]func() verbs.Provider{
		"soft": func() verbs.Provider { return soft.New(soft.Options{TimeScale: 0.01}) },
	}
	if p, err := defaultProvider(); err == nil {
		ps["default-"+p.Name()] = func() verbs.Provider { return p }
	} else {
		t.Logf("no default provider here, soft only: %v", err)
	}
	return ps
}

// exchange writes msg each way and checks that it arrives.
func exchange(t *testing.T, c, s net.Conn, msg string) {
	t.Helper()
	for _, dir := range []struct{ from, to net.Conn }{{c, s}, {s, c}} {
		errc := make(chan error, 1)
		go func() {
			_, err := dir.from.Write([]byte(msg))
			errc <- err
		}()
		got := make([]byte, len(msg))
		_, err := io.ReadFull(dir.to, got)
		require.NoError(t, err)
		require.NoError(t, <-errc)
		require.Equal(t, msg, string(got))
	}
}

// TestFaultPathUnreachable: the QPs reach RTS, but RoCE does not cross the path (as
// with UDP 4791 filtered). Both sides fall back with ErrPathUnproven, whose text names
// the likely cause, and every byte written, before and after, arrives on the fallback
// transport. Nothing is left allocated.
func TestFaultPathUnreachable(t *testing.T) {
	for _, f := range transports {
		t.Run(f.String(), func(t *testing.T) {
			fab := soft.New(soft.Options{TimeScale: 0.01})
			require.NoError(t, fab.SetPath(loopbackGID, loopbackGID, soft.Path{Unreachable: true}))
			scfg, ccfg := rdmaConfigs(t, f, fab)
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			for side, conn := range map[string]*Conn{"client": c, "server": s} {
				require.Equal(t, f.String(), conn.Transport(), side)
				require.ErrorIs(t, conn.FallbackReason(), ErrPathUnproven, side)
				require.ErrorContains(t, conn.FallbackReason(), "UDP 4791", side)
			}
			exchange(t, c, s, "every byte, on the fallback transport")
			require.NoError(t, c.Close())
			require.NoError(t, s.Close())
			require.NoError(t, ln.Close())
			requireReleased(t, fab)
		})
	}
}

// TestUpgradeLossyPath: a path that loses every third request still proves itself
// through retransmissions; the connection upgrades and moves its bytes.
func TestUpgradeLossyPath(t *testing.T) {
	fab := soft.New(soft.Options{TimeScale: 0.01})
	require.NoError(t, fab.SetPath(loopbackGID, loopbackGID, soft.Path{DropEvery: 3}))
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
	ln := listen(t, scfg)
	c, s := pipe(t, ln, ccfg)
	require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
	require.Equal(t, TransportRDMA, s.Transport(), "server: %v", s.FallbackReason())
	exchange(t, c, s, strings.Repeat("lossy but proven ", 1000))
	require.Positive(t, fab.Stats().Retries)
	c.Close()
	s.Close()
}

// recordingProxy forwards one client connection to addr, both ways, and keeps what the
// client sent. With tee, it also opens a second connection to addr and sends it the
// client's bytes too, discarding its answers: the client's stream spliced onto another
// bootstrap connection. teeDone is closed when that second connection ends.
type recordingProxy struct {
	addr    string
	mu      sync.Mutex
	sent    bytes.Buffer
	teeDone chan struct{}
}

func startProxy(t *testing.T, target string, tee bool) *recordingProxy {
	t.Helper()
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &recordingProxy{addr: pl.Addr().String(), teeDone: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() { pl.Close(); wg.Wait() })
	wg.Go(func() {
		defer pl.Close()
		in, err := pl.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer out.Close()
		var sinks []io.Writer
		sinks = append(sinks, out, writerFunc(p.record))
		if tee {
			second, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer second.Close()
			sinks = append(sinks, second)
			wg.Go(func() {
				defer close(p.teeDone)
				io.Copy(io.Discard, second) // until the server closes it
			})
		} else {
			close(p.teeDone)
		}
		wg.Go(func() {
			io.Copy(in, out)
			in.Close()
		})
		io.Copy(io.MultiWriter(sinks...), in)
		if tc, ok := out.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	})
	return p
}

func (p *recordingProxy) record(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent.Write(b)
}

// offer returns the client's offer as the proxy saw it.
func (p *recordingProxy) offer(t *testing.T) []byte {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var hr helloReader
	h, err := hr.read(bytes.NewReader(p.sent.Bytes()))
	require.NoError(t, err)
	require.True(t, h.offersRDMA())
	return bytes.Clone(p.sent.Bytes()[:hr.n])
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// TestHelloReplayed: a client's offer, captured on the way, replayed on another
// bootstrap connection, gets an accept (the hello alone cannot tell), but no proof
// follows over the QP the server connected for it: whatever the replaying party
// confirms, the server never hands out an RDMA Conn, and the Listener keeps serving.
// The accept it sees carries no ring address or key.
func TestHelloReplayed(t *testing.T) {
	tests := []struct {
		name    string
		confirm []byte // sent after the accept; nil: close
		reason  error  // of the fallback Conn the server hands out; nil: none
		logged  string // in the failed handshake's log line
	}{
		{name: "confirm ready", confirm: []byte{confirmReady}, logged: "confirmed an unproven upgrade"},
		{name: "confirm unproven", confirm: []byte{confirmUnproven}, reason: ErrPathUnproven},
		{name: "close", logged: "read confirmation"},
	}
	for pname, provider := range bindingProviders(t) {
		for _, tt := range tests {
			t.Run(pname+"/"+tt.name, func(t *testing.T) {
				var logs logBuffer
				scfg, ccfg := providerConfigs(t, provider())
				scfg.Logger = logs.logger()
				ln := listen(t, scfg)

				// The victim, through a proxy that records its offer.
				p := startProxy(t, ln.Addr().String(), false)
				victim, err := Dial("tcp", p.addr, ccfg)
				require.NoError(t, err)
				defer victim.Close()
				vs, err := ln.AcceptRsock()
				require.NoError(t, err)
				defer vs.Close()
				require.Equal(t, TransportRDMA, victim.Transport(), "victim: %v", victim.FallbackReason())
				offer := p.offer(t)

				// The replay.
				raw := dialRaw(t, ln)
				_, err = raw.Write(offer)
				require.NoError(t, err)
				var hr helloReader
				h, err := hr.read(raw)
				require.NoError(t, err)
				require.Equal(t, helloAccept, h.kind)
				require.Equal(t, rdmaEndpointLen+unitRingLen+growWQEsLen, len(h.rdma.appendTo(nil)), "the accept carries no ring")
				if tt.confirm != nil {
					_, err = raw.Write(tt.confirm)
					require.NoError(t, err)
				} else {
					raw.(*net.TCPConn).CloseWrite()
				}
				if tt.reason != nil {
					s, err := ln.AcceptRsock()
					require.NoError(t, err)
					require.Equal(t, TransportTCP, s.Transport())
					require.ErrorIs(t, s.FallbackReason(), tt.reason)
					s.Close()
				} else {
					io.ReadAll(raw) // until the server closes it
					requireLogged(t, &logs, tt.logged)
				}
				exchange(t, victim, vs, "the victim's stream is untouched")
				requireServing(t, ln, ccfg)
			})
		}
	}
}

// providerConfigs returns server and client Configs on provider p over TCP.
func providerConfigs(t *testing.T, p verbs.Provider) (server, client *Config) {
	server, client = configs(t, FallbackTCP)
	server.Provider, client.Provider = p, p
	return server, client
}

// requireLogged checks that a failed handshake was logged with text. The Listener logs
// before it closes the connection, so a caller that saw the close finds the line.
func requireLogged(t *testing.T, logs *logBuffer, text string) {
	t.Helper()
	require.Contains(t, logs.String(), "handshake failed")
	require.Contains(t, logs.String(), text)
}

// TestHelloSpliced: a client's whole stream is copied onto a second bootstrap
// connection (a tee on the way). The client and the server it talks to upgrade; the
// second connection gets the same offer and, later, the client's confirmation, but its
// QP never receives a proof, so the server fails that handshake instead of handing out
// a second RDMA Conn.
func TestHelloSpliced(t *testing.T) {
	for pname, provider := range bindingProviders(t) {
		t.Run(pname, func(t *testing.T) { testHelloSpliced(t, provider()) })
	}
}

func testHelloSpliced(t *testing.T, provider verbs.Provider) {
	var logs logBuffer
	scfg, ccfg := providerConfigs(t, provider)
	scfg.Logger = logs.logger()
	ln := listen(t, scfg)
	p := startProxy(t, ln.Addr().String(), true)
	c, err := Dial("tcp", p.addr, ccfg)
	require.NoError(t, err)
	defer c.Close()
	s, err := ln.AcceptRsock()
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
	require.Equal(t, TransportRDMA, s.Transport(), "server: %v", s.FallbackReason())
	<-p.teeDone // the server closed the spliced connection
	requireLogged(t, &logs, "confirmed an unproven upgrade")
	exchange(t, c, s, "the real pair is untouched")
	requireServing(t, ln, ccfg)
}

// attacker is a party with its own soft QP and a raw bootstrap connection: it sends a
// well-formed offer for its QP, connects the QP to the server's from the accept, and
// sends what it likes over it.
type attacker struct {
	raw    net.Conn
	qp     verbs.QP
	mr     verbs.MR
	cq     verbs.CQ
	offer  rdmaEndpoint
	accept rdmaEndpoint
}

func newAttacker(t *testing.T, p verbs.Provider, ln *Listener) *attacker {
	t.Helper()
	dev, port, gid := loopbackDevice(t, p)
	ctx, err := p.Open(dev)
	require.NoError(t, err)
	t.Cleanup(func() { ctx.Close() })
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { pd.Close() })
	a := &attacker{raw: dialRaw(t, ln)}
	a.cq, err = ctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	t.Cleanup(func() { a.cq.Close() })
	a.mr, err = pd.RegMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	t.Cleanup(func() { a.mr.Close() })
	a.qp, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: a.cq, RecvCQ: a.cq, Caps: verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	t.Cleanup(func() { a.qp.Close() })
	require.NoError(t, a.qp.ToInit(verbs.InitAttr{Port: port, Access: verbs.AccessRemoteWrite}))
	a.offer = rdmaEndpoint{GID: loopbackGID, MTU: verbs.MTU1024, QPN: a.qp.QPN(), PSN: 0x42, RingSize: 4096, RecvWQEs: 8, Nonce: newNonce()}
	_, err = a.raw.Write(offerHello(&a.offer).appendTo(nil))
	require.NoError(t, err)
	var hr helloReader
	h, err := hr.read(a.raw)
	require.NoError(t, err)
	require.Equal(t, helloAccept, h.kind)
	a.accept = h.rdma
	require.NoError(t, a.qp.ToRTR(verbs.RTRAttr{
		PathMTU: verbs.MTU1024, DestQPN: a.accept.QPN, RQPSN: a.accept.PSN,
		Dest: verbs.AddressVector{Port: port, IsGlobal: true, DestGID: a.accept.GID, SGIDIndex: gid, HopLimit: 64},
	}))
	require.NoError(t, a.qp.ToRTS(verbs.RTSAttr{SQPSN: 0x42, Timeout: 14, RetryCount: 7, RNRRetry: 7}))
	return a
}

// loopbackDevice finds the device, port and GID index (the hardware's) that hold
// 127.0.0.1 on provider p.
func loopbackDevice(t *testing.T, p verbs.Provider) (dev string, port, gid uint8) {
	t.Helper()
	devs, err := p.Devices()
	require.NoError(t, err)
	for _, d := range devs {
		for _, pa := range d.Ports {
			for _, g := range pa.GIDs {
				if g.GID == loopbackGID && g.Index < 256 {
					return d.Name, pa.Num, uint8(g.Index)
				}
			}
		}
	}
	t.Fatalf("no device of %s holds 127.0.0.1", p.Name())
	return "", 0, 0
}

// send posts b as one signaled SEND and waits for its completion.
func (a *attacker) send(t *testing.T, b []byte) verbs.WCStatus {
	t.Helper()
	copy(a.mr.Bytes(), b)
	require.NoError(t, a.qp.PostSend([]verbs.SendWR{{
		ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: uint32(len(b)), LKey: a.mr.LKey()}},
	}}))
	wc := make([]verbs.WorkCompletion, 1)
	for {
		n, err := a.cq.Poll(wc)
		require.NoError(t, err)
		if n == 1 {
			return wc[0].Status
		}
	}
}

// TestProofAdversarial: a party that owns a QP and speaks the hello, but sends over its
// QP something other than this connection's client proof, never gets an RDMA Conn from
// the server, whatever it confirms; the Listener keeps serving.
func TestProofAdversarial(t *testing.T) {
	proofs := []struct {
		name  string
		proof func(a *attacker) []byte
	}{
		{"garbage", func(*attacker) []byte { return []byte("this is not a proof, just bytes on the QP....") }},
		{"another connection's nonces", func(a *attacker) []byte {
			p := proof{role: roleClient, client: a.offer.Nonce, server: newNonce()}
			return p.appendTo(nil)
		}},
		{"reflected server role", func(a *attacker) []byte {
			p := proof{role: roleServer, client: a.offer.Nonce, server: a.accept.Nonce}
			return p.appendTo(nil)
		}},
	}
	for pname, provider := range bindingProviders(t) {
		for _, pf := range proofs {
			for _, confirm := range []byte{confirmReady, confirmUnproven} {
				t.Run(pname+"/"+pf.name+"/"+string(confirm), func(t *testing.T) {
					var logs logBuffer
					p := provider()
					scfg, ccfg := providerConfigs(t, p)
					scfg.Logger = logs.logger()
					ln := listen(t, scfg)
					a := newAttacker(t, p, ln)
					require.Equal(t, verbs.WCSuccess, a.send(t, pf.proof(a)), "the proof reached the server's QP")
					_, err := a.raw.Write([]byte{confirm})
					require.NoError(t, err)
					if confirm == confirmUnproven {
						s, err := ln.AcceptRsock()
						require.NoError(t, err)
						defer s.Close()
						require.Equal(t, TransportTCP, s.Transport())
						require.ErrorIs(t, s.FallbackReason(), ErrPathUnproven)
						return
					}
					io.ReadAll(a.raw) // until the server closes it
					requireLogged(t, &logs, "confirmed an unproven upgrade")
					requireServing(t, ln, ccfg)
				})
			}
		}
	}
}

// TestConfirmWithoutProof: a client that sends no proof at all and confirms at once is
// refused, and the Listener keeps serving.
func TestConfirmWithoutProof(t *testing.T) {
	for pname, provider := range bindingProviders(t) {
		t.Run(pname, func(t *testing.T) { testConfirmWithoutProof(t, provider()) })
	}
}

func testConfirmWithoutProof(t *testing.T, p verbs.Provider) {
	var logs logBuffer
	scfg, ccfg := providerConfigs(t, p)
	scfg.Logger = logs.logger()
	ln := listen(t, scfg)
	a := newAttacker(t, p, ln)
	_, err := a.raw.Write([]byte{confirmReady})
	require.NoError(t, err)
	io.ReadAll(a.raw) // until the server closes it
	requireLogged(t, &logs, "no proof arrived over RDMA")
	requireServing(t, ln, ccfg)
}

// TestUpgradeTrafficClass: Config's TrafficClass and ServiceLevel reach the address
// vector of both sides' QPs, as the device reports it (ibv_query_qp where the build and
// the machine have a device: rxe in the VM, which reports the traffic class but keeps no
// service level), and the connection moves bytes.
func TestUpgradeTrafficClass(t *testing.T) {
	providers := map[string]verbs.Provider{"soft": soft.New(soft.Options{})}
	if p, err := defaultProvider(); err == nil {
		providers["default-"+p.Name()] = p
	}
	for name, p := range providers {
		t.Run(name, func(t *testing.T) {
			scfg, ccfg := configs(t, FallbackTCP)
			for _, cfg := range []*Config{scfg, ccfg} {
				cfg.Provider, cfg.TrafficClass, cfg.ServiceLevel = p, 26<<2, 3 // DSCP 26 (AF31)
			}
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			defer c.Close()
			defer s.Close()
			for side, conn := range map[string]*Conn{"client": c, "server": s} {
				require.Equal(t, TransportRDMA, conn.Transport(), "%s: %v", side, conn.FallbackReason())
				rc, ok := conn.s.(*rdma.Conn)
				require.True(t, ok, "%s: an RDMA Conn's stream", side)
				attr, err := rc.QueryQP()
				require.NoError(t, err, side)
				require.Equal(t, verbs.QPStateRTS, attr.State, side)
				require.Equal(t, uint8(26<<2), attr.Dest.TrafficClass, "%s: traffic class", side)
				if name == "soft" || attr.Dest.SL != 0 {
					require.Equal(t, uint8(3), attr.Dest.SL, "%s: service level", side)
				} else {
					// rxe keeps no SL in its address vector (it has no VLAN priority
					// to map it to), and reports 0: the request reached the device,
					// whose answer this is.
					t.Logf("%s: %s reports service level 0 for the 3 set", side, name)
				}
			}
			exchange(t, c, s, "in a lossless class")
		})
	}
}

// TestLocalIP checks the address the RDMA device is chosen by, for the address types
// the bootstrap connections have (TCP, UDP for QUIC) and one it parses from text.
func TestLocalIP(t *testing.T) {
	tests := []struct {
		name          string
		local, remote net.Addr
		want          netip.Addr
		wantOK        bool
	}{
		{name: "tcp", local: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 7}, remote: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2)},
			want: netip.MustParseAddr("10.0.0.1"), wantOK: true},
		{name: "tcp6", local: &net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}, remote: &net.TCPAddr{IP: net.ParseIP("fe80::2")},
			want: netip.MustParseAddr("fe80::1%eth0"), wantOK: true},
		{name: "udp wildcard, loopback peer", local: &net.UDPAddr{IP: net.IPv4zero, Port: 9}, remote: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)},
			want: netip.MustParseAddr("127.0.0.1"), wantOK: true},
		{name: "udp wildcard, remote peer", local: &net.UDPAddr{IP: net.IPv6unspecified}, remote: &net.UDPAddr{IP: net.IPv4(10, 0, 0, 2)}},
		{name: "other type", local: textAddr("192.0.2.1:80"), remote: textAddr("192.0.2.2:80"),
			want: netip.MustParseAddr("192.0.2.1"), wantOK: true},
		{name: "unparsable", local: textAddr("pipe"), remote: textAddr("pipe")},
	}
	for _, tt := range tests {
		got, ok := localIP(addrConn{local: tt.local, remote: tt.remote})
		require.Equal(t, tt.wantOK, ok, "localIP(%v, %v) found an address", tt.local, tt.remote)
		require.Equal(t, tt.want, got, "localIP(%v, %v)", tt.local, tt.remote)
	}
}

// addrConn is a bootConn that has addresses only.
type addrConn struct {
	bootConn
	local, remote net.Addr
}

func (c addrConn) LocalAddr() net.Addr  { return c.local }
func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// textAddr is a net.Addr of another type than TCP's and UDP's.
type textAddr string

func (a textAddr) Network() string { return "text" }
func (a textAddr) String() string  { return string(a) }

// TestPrepareEarly checks the server's endpoint prepared before the offer is read
// (acceptState.prepareEarly): on a warm device, a connection that has sent nothing yet
// already holds one queue pair, charged to its remote address; whatever the client
// then does (offer no RDMA, close, offer RDMA and upgrade), nothing of it is left
// once the handshake is over, beyond the upgraded connection's own.
func TestPrepareEarly(t *testing.T) {
	tests := []struct {
		name    string
		client  func(t *testing.T, raw net.Conn)
		upgrade bool // the client upgrades: one QP stays, the server's Conn's
	}{
		{name: "offer without RDMA", client: func(t *testing.T, raw net.Conn) {
			require.NoError(t, writeHello(raw, offerHello(nil)))
			var hr helloReader
			h, err := hr.read(raw)
			require.NoError(t, err)
			require.Equal(t, helloDecline, h.kind, "the server's answer to an offer without RDMA")
		}},
		{name: "close before the offer", client: func(t *testing.T, raw net.Conn) {
			require.NoError(t, raw.Close())
		}},
		{name: "offer RDMA", upgrade: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg) // the device warms up
			require.Equal(t, TransportRDMA, c.Transport(), "warming connection: %v", c.FallbackReason())
			c.Close()
			s.Close()
			ln.spare.settle()
			require.Eventually(t, func() bool { return fab.Stats().QPs == ln.spare.qps() }, 10*time.Second, time.Millisecond,
				"the warming connection's QPs are gone; the Listener's spare endpoint (spare.go) may stay")

			raw, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer raw.Close()
			key, _ := remoteKey(raw.LocalAddr())
			// The endpoint is the Listener's spare, taken, or one prepared afresh.
			require.Eventually(t, func() bool { return fab.Stats().QPs == 1 && ln.spare.qps() == 0 }, 10*time.Second, time.Millisecond,
				"a QP prepared before the offer arrives")
			require.Eventually(t, func() bool {
				total, remote, _ := ln.budget.held(key)
				return total.qps == 1 && total == remote
			}, 10*time.Second, time.Millisecond, "QPs charged to the listener and to the remote address %v before the offer", key)

			wantQPs := 0
			if tt.upgrade {
				// A client that offers RDMA gets the endpoint prepared for it: the
				// connection upgrades and holds one QP per end, no more.
				c, err := Dial("tcp", ln.Addr().String(), ccfg)
				require.NoError(t, err)
				defer c.Close()
				s, err := ln.AcceptRsock()
				require.NoError(t, err)
				defer s.Close()
				require.Equal(t, TransportRDMA, c.Transport(), "upgrade: %v", c.FallbackReason())
				require.NoError(t, raw.Close()) // the raw connection's early endpoint goes too
				wantQPs = 2
			} else {
				tt.client(t, raw)
			}
			require.Eventually(t, func() bool { return fab.Stats().QPs == wantQPs }, 10*time.Second, time.Millisecond,
				"QPs once the handshakes are over: %+v", fab.Stats())
			require.Eventually(t, func() bool {
				total, _, _ := ln.budget.held(key)
				return total.qps == wantQPs/2
			}, 10*time.Second, time.Millisecond, "QPs charged once the handshakes are over")
		})
	}
}

// TestUpgradeClientBeforeWQEGrowth: a client from before the hello carried the receive
// queue's growth (its offer lacks the field, and it ignores the server's) and a server
// of today stream small writes one way and then the other over RDMA: neither receive
// queue grows, since neither peer would take the new WQEs' credit, and every byte
// arrives. Between a client and a server of today the same streams grow both queues.
func TestUpgradeClientBeforeWQEGrowth(t *testing.T) {
	for _, tt := range []struct {
		name   string
		before bool
		wqes   int
	}{
		{"client from before", true, 64},
		{"client of today", false, 128},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dialAsBeforeWQEGrowth = tt.before
			t.Cleanup(func() { dialAsBeforeWQEGrowth = false })
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())

			data := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstu"), (2<<20)/31)
			for _, pair := range [][2]*Conn{{c, s}, {s, c}} {
				w, r := pair[0], pair[1]
				errs := make(chan error, 1)
				go func() {
					var err error
					for off := 0; off < len(data) && err == nil; off += 2 << 10 {
						_, err = w.Write(data[off:min(off+2<<10, len(data))])
					}
					errs <- err
				}()
				got := make([]byte, len(data))
				_, err := io.ReadFull(r, got)
				require.NoError(t, err)
				require.NoError(t, <-errs)
				require.True(t, bytes.Equal(data, got), "the stream arrived changed")
			}
			require.Equal(t, tt.wqes, s.Stats().RecvWQEs, "the server's receive WQEs")
			require.Equal(t, tt.wqes, c.Stats().RecvWQEs, "the client's receive WQEs")
			require.NoError(t, c.Close())
			require.NoError(t, s.Close())
		})
	}
}

// TestUpgradeClientBeforeUnitRing: a client from before the hello carried the unit ring
// (its offer lacks the byte, and it ignores the server's) and a server of today stream
// both ways over RDMA at the defaults: neither fixes a credit unit, so each takes the
// other's from its ring size, as that client does, rings grow to 512 KiB at most, and
// every byte arrives in order. Between a client and a server of today the same stream
// grows the rings to 4 MiB. Nobody reads until the rings have grown, so that each ring
// fills, and grows, at every step.
func TestUpgradeClientBeforeUnitRing(t *testing.T) {
	for _, tt := range []struct {
		name   string
		before bool
		ring   int
	}{
		{"client from before", true, 512 << 10},
		{"client of today", false, 4 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dialAsBeforeUnitRing = tt.before
			t.Cleanup(func() { dialAsBeforeUnitRing = false })
			fab := soft.New(soft.Options{})
			scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)
			ln := listen(t, scfg)
			c, s := pipe(t, ln, ccfg)
			require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
			// Not a timing: ends that disagree on a unit may stall for good, and fail so.
			for _, conn := range []*Conn{c, s} {
				require.NoError(t, conn.SetDeadline(time.Now().Add(time.Minute)))
			}

			const total = 12 << 20
			data := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstu"), total/31+1)[:total]
			errs := make(chan error, 2)
			for _, w := range []*Conn{c, s} {
				go func() {
					_, err := w.Write(data)
					if err == nil {
						err = w.CloseWrite()
					}
					errs <- err
				}()
			}
			require.Eventually(t, func() bool { return c.Stats().RingSize == tt.ring && s.Stats().RingSize == tt.ring },
				30*time.Second, time.Millisecond, "rings of %d and %d bytes, want %d", c.Stats().RingSize, s.Stats().RingSize, tt.ring)
			for _, r := range []*Conn{s, c} {
				got, err := io.ReadAll(r)
				require.NoError(t, err)
				require.True(t, bytes.Equal(data, got), "the stream arrived changed")
			}
			require.NoError(t, <-errs)
			require.NoError(t, <-errs)
			require.Equal(t, tt.ring, s.Stats().RingSize, "the server's ring")
			require.Equal(t, tt.ring, c.Stats().RingSize, "the client's ring")
			require.NoError(t, c.Close())
			require.NoError(t, s.Close())
		})
	}
}

// TestUnprovenHint: the cause an unproven path's reason names is the network's over
// RDMA, and the peer process's on shared memory, where no RoCE packet is sent.
func TestUnprovenHint(t *testing.T) {
	tests := []struct {
		shm           bool
		names, absent string
	}{
		{false, "UDP 4791", "open files"},
		{true, "open files (RLIMIT_NOFILE)", "RoCE"},
	}
	for _, tt := range tests {
		hint := unprovenHint(tt.shm)
		require.Contains(t, hint, tt.names, "shm %v", tt.shm)
		require.NotContains(t, hint, tt.absent, "shm %v", tt.shm)
	}
}

//go:build rdma && linux && cgo

package ibv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/testfiles"
	"github.com/rsockio/rsock/verbs"
)

// The tests in this file run the provider against testdata/fakeverbs, a test double
// of libibverbs.so.1 built here with the C compiler. libibverbs is loaded once per
// process, so each scenario runs in a child process of the test binary with
// LD_LIBRARY_PATH pointing at the double: the child runs TestFakeLibibverbs again,
// which, finding childEnv set, runs the scenario it names instead of starting children. The double checks the plumbing (masks,
// byte order, no Go pointers in C, acknowledged events); it is not a model of a
// device: see the comment at the top of fakeverbs.c.

const childEnv = "RSOCK_IBV_FAKE_CHILD"

// fakeScenarios are the scenarios a child process runs, by the name in childEnv.
var fakeScenarios = map[string]func(t *testing.T){
	"device":     fakeDevice,
	"no-device":  fakeNoDevice,
	"broken-lib": fakeBrokenLib,
	"gid-table":  fakeGIDTable,
	"no-files":   fakeNoFiles,
	"real-files": realDevicesOutOfFiles, // open_rdma_test.go, with no double loaded
}

// buildLib compiles a C file into dir/libibverbs.so.1, with the C compiler that built
// this cgo package (so one is there).
func buildLib(t *testing.T, dir string, args ...string) {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	cmd := exec.Command(cc, append([]string{"-shared", "-fPIC", "-O1", "-Wall",
		"-o", filepath.Join(dir, "libibverbs.so.1"), "-Wl,-soname,libibverbs.so.1"}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "building the libibverbs test double: %s", out)
}

// runChild runs a scenario in a child process with the double in libDir loaded.
func runChild(t *testing.T, libDir, scenario string, env ...string) string {
	t.Helper()
	const test = "TestFakeLibibverbs"
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libDir, childEnv+"="+scenario,
		// Under -race, a child would otherwise sleep a second before exiting.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+test) {
		t.Fatalf("child %s %v: %v\n%s", scenario, env, err, out)
	}
	if testing.Verbose() {
		t.Logf("child %s %v:\n%s", scenario, env, out)
	}
	return string(out)
}

func TestFakeLibibverbs(t *testing.T) {
	if name := os.Getenv(childEnv); name != "" {
		scenario := fakeScenarios[name]
		if scenario == nil {
			t.Fatalf("%s=%q names no scenario", childEnv, name)
		}
		scenario(t)
		return
	}
	dir := t.TempDir()
	buildLib(t, dir, "-Wl,--version-script=testdata/fakeverbs/fakeverbs.map", "testdata/fakeverbs/fakeverbs.c")

	t.Run("extended context", func(t *testing.T) { runChild(t, dir, "device") })
	t.Run("compat query_port", func(t *testing.T) { runChild(t, dir, "device", "FAKEVERBS_COMPAT=1") })
	t.Run("GID table by ibv_query_gid_table", func(t *testing.T) { runChild(t, dir, "gid-table", "FAKEVERBS_GIDTABLE=1") })
	t.Run("no device", func(t *testing.T) { runChild(t, dir, "no-device", "FAKEVERBS_NODEV=1") })
	t.Run("out of file descriptors", func(t *testing.T) { runChild(t, dir, "no-files") })
	t.Run("caller memory", func(t *testing.T) { runChild(t, dir, "user-memory") }) // usermr_rdma_test.go

	// A library that lacks the functions: Open reports which, as a LibraryError.
	broken := t.TempDir()
	src := filepath.Join(broken, "empty.c")
	require.NoError(t, os.WriteFile(src, []byte("void rsock_not_libibverbs(void) {}\n"), 0o644))
	buildLib(t, broken, src)
	t.Run("missing symbols", func(t *testing.T) { runChild(t, broken, "broken-lib") })
}

// fakeGIDTable reads the double's GID table through ibv_query_gid_table: the entries of
// port 1 only, in hardware index order with the holes kept, types as on an Ethernet
// port, netdevs by interface index (1 is the loopback interface). The sysfs tree, which
// holds other GIDs, is not read.
func fakeGIDTable(t *testing.T) {
	sysfsRoot = "testdata/sysfs-fake"
	p, err := Open()
	require.NoError(t, err)
	devs, err := p.Devices()
	require.NoError(t, err)
	require.Len(t, devs, 1)
	lo, err := net.InterfaceByIndex(1)
	require.NoError(t, err)
	require.Equal(t, []verbs.GIDEntry{
		{Index: 0, GID: gid("fe80::a00:27ff:fe00:7"), Type: verbs.GIDTypeRoCEv1, Netdev: lo.Name},
		{Index: 3, GID: gid("fd00::7"), Type: verbs.GIDTypeRoCEv1},
		{Index: 6, GID: gid("::ffff:10.7.0.8"), Type: verbs.GIDTypeRoCEv2, Netdev: lo.Name},
	}, devs[0].Ports[0].GIDs)

	ctx, err := p.Open("fake0")
	require.NoError(t, err)
	defer ctx.Close()
	port, err := ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, devs[0].Ports[0].GIDs, port.GIDs)
}

func fakeNoDevice(t *testing.T) {
	p, err := Open()
	require.Nil(t, p)
	require.ErrorIs(t, err, verbs.ErrNoDevice)
	require.EqualError(t, err, "ibv: no RDMA device: libibverbs lists none")
}

// fakeNoFiles opens the library with every file descriptor of the process taken: the
// error says so, is Temporary, and is not kept: once descriptors are free, Open loads
// the library. Then it lists devices with every descriptor taken, which libibverbs
// (and the double) fails with ENOSYS: the error names the process's want of files
// and matches verbs.ErrNoResources, not verbs.ErrNoDevice; so does a listing that
// left the device out for want of a second descriptor (one free), whether Devices or
// Open(name) made it, and a descriptor that cannot be duplicated for the netpoller
// (pollFile).
func fakeNoFiles(t *testing.T) {
	testfiles.Limit(t, 256)
	take := func() func() { return testfiles.Take(t, 0) }
	release := take()
	_, err := Open()
	release()
	var le *LibraryError
	require.ErrorAs(t, err, &le)
	require.True(t, le.Temporary, "%v", err)
	require.ErrorIs(t, err, verbs.ErrNoResources)
	require.NotErrorIs(t, err, verbs.ErrNotSupported)
	require.ErrorContains(t, err, "Too many open files")
	t.Log(err)

	p, err := Open()
	require.NoError(t, err, "with descriptors free again")
	require.NotNil(t, p)

	release = take()
	_, err = Open()
	release()
	require.ErrorIs(t, err, syscall.EMFILE)
	require.ErrorIs(t, err, verbs.ErrNoResources)
	require.NotErrorIs(t, err, verbs.ErrNoDevice, "the kernel has RDMA support: the process is out of files")
	t.Log(err)
	_, err = Open()
	require.NoError(t, err, "with descriptors free again")

	// One descriptor free: the double lists no device, and says nothing of why.
	sysfsRoot = "testdata/sysfs-fake"
	p, err = Open()
	require.NoError(t, err)
	release = testfiles.Take(t, 1)
	_, devErr := p.Devices()
	_, openErr := p.Open("fake0")
	_, libErr := Open()
	release()
	for _, err := range []error{devErr, openErr, libErr} {
		require.ErrorIs(t, err, syscall.EMFILE)
		require.ErrorIs(t, err, verbs.ErrNoResources)
		require.NotErrorIs(t, err, verbs.ErrNoDevice)
		t.Log(err)
	}
	devs, err := p.Devices()
	require.NoError(t, err, "with descriptors free again")
	require.Len(t, devs, 1)

	// A channel's or context's descriptor that cannot be duplicated for the netpoller.
	var fds [2]int
	require.NoError(t, syscall.Pipe2(fds[:], syscall.O_CLOEXEC))
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	release = take()
	_, err = pollFile(fds[0], "pipe")
	release()
	require.ErrorIs(t, err, syscall.EMFILE)
	require.ErrorIs(t, err, verbs.ErrNoResources)
}

func fakeBrokenLib(t *testing.T) {
	_, err := Open()
	var le *LibraryError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, err, verbs.ErrNotSupported)
	require.Contains(t, err.Error(), "ibv: dlsym ibv_get_device_list: ")
	t.Log(err)
}

// fakeRig is two connected QPs on the double's device.
type fakeRig struct {
	ctx      verbs.Context
	pd       verbs.PD
	ch       verbs.CompChannel
	cqA, cqB verbs.CQ
	a, b     verbs.QP
	mrA, mrB verbs.MR
}

func newFakeRig(t *testing.T, caps verbs.QPCaps) *fakeRig {
	t.Helper()
	p, err := Open()
	require.NoError(t, err)
	devs, err := sysfsDevices(sysfsRoot)
	require.NoError(t, err)
	sel, err := verbs.SelectPort(devs, netip.MustParseAddr("10.7.0.7"))
	require.NoError(t, err)
	require.Equal(t, "fake0", sel.Device.Name)
	require.Equal(t, 3, sel.GID.Index)

	r := &fakeRig{}
	r.ctx, err = p.Open(sel.Device.Name)
	require.NoError(t, err)
	r.pd, err = r.ctx.AllocPD()
	require.NoError(t, err)
	r.ch, err = r.ctx.CreateCompChannel()
	require.NoError(t, err)
	r.cqA, err = r.ctx.CreateCQ(64, r.ch, 0)
	require.NoError(t, err)
	r.cqB, err = r.ctx.CreateCQ(256, r.ch, 0)
	require.NoError(t, err)
	access := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead
	r.mrA, err = r.pd.RegMR(4096, access)
	require.NoError(t, err)
	r.mrB, err = r.pd.RegMR(4096, access)
	require.NoError(t, err)
	r.a, err = r.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cqA, RecvCQ: r.cqA, Caps: caps})
	require.NoError(t, err)
	r.b, err = r.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cqB, RecvCQ: r.cqB, Caps: caps})
	require.NoError(t, err)
	require.Equal(t, verbs.QPStateReset, r.a.State())

	connect := func(q, peer verbs.QP) {
		require.NoError(t, q.ToInit(verbs.InitAttr{Port: sel.Port.Num, Access: access}))
		require.NoError(t, q.ToRTR(verbs.RTRAttr{
			PathMTU: verbs.MTU1024, DestQPN: peer.QPN(), RQPSN: 7, MaxDestRdAtomic: 1, MinRNRTimer: 12,
			Dest: verbs.AddressVector{Port: sel.Port.Num, IsGlobal: true, DestGID: sel.GID.GID, SGIDIndex: uint8(sel.GID.Index)},
		}))
		require.NoError(t, q.ToRTS(verbs.RTSAttr{SQPSN: 7, Timeout: 14, RetryCount: 7, RNRRetry: 7, MaxRdAtomic: 1}))
		require.Equal(t, verbs.QPStateRTS, q.State())
	}
	connect(r.a, r.b)
	connect(r.b, r.a)
	return r
}

func (r *fakeRig) close(t *testing.T) {
	t.Helper()
	for _, c := range []interface{ Close() error }{r.a, r.b, r.mrA, r.mrB, r.cqA, r.cqB, r.ch, r.pd, r.ctx} {
		require.NoError(t, c.Close())
	}
}

// pollOne polls cq until one completion arrives.
func pollOne(t *testing.T, cq verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	var wc [1]verbs.WorkCompletion
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		n, err := cq.Poll(wc[:])
		require.NoError(t, err)
		if n == 1 {
			return wc[0]
		}
		// Paces the poll; the C test double completes on its own threads in real
		// time, out of synctest's reach.
		time.Sleep(time.Millisecond)
	}
	t.Fatal("no completion")
	return verbs.WorkCompletion{}
}

func fakeDevice(t *testing.T) {
	sysfsRoot = "testdata/sysfs-fake"

	t.Run("devices", func(t *testing.T) {
		p, err := Open()
		require.NoError(t, err)
		require.Equal(t, "ibv", p.Name())
		devs, err := p.Devices()
		require.NoError(t, err)
		require.Len(t, devs, 1)
		d := devs[0]
		require.Equal(t, "fake0", d.Name)
		require.Equal(t, uint64(0x0002c90300a1b2c3), d.NodeGUID)
		require.Equal(t, 4, d.MaxSGE)
		require.Equal(t, 512, d.MaxInline, "probed max inline")
		require.Len(t, d.Ports, 1)
		port := d.Ports[0]
		require.Equal(t, verbs.PortActive, port.State)
		require.Equal(t, verbs.LinkLayerEthernet, port.LinkLayer)
		require.Equal(t, verbs.MTU4096, port.MaxMTU)
		require.Equal(t, verbs.MTU1024, port.ActiveMTU)
		require.Len(t, port.GIDs, 4)
		require.Equal(t, verbs.GIDEntry{Index: 3, GID: gid("::ffff:10.7.0.7"), Type: verbs.GIDTypeRoCEv2, Netdev: "eth7"}, port.GIDs[3])

		_, err = p.Open("mlx5_9")
		require.ErrorIs(t, err, verbs.ErrNoDevice)
	})

	t.Run("write with immediate", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 1, MaxInlineData: 64})
		defer r.close(t)
		copy(r.mrA.Bytes(), "hello, rdma")
		require.NoError(t, r.b.PostRecv([]verbs.RecvWR{{ID: 42}}))
		require.NoError(t, r.cqB.ReqNotify(false))
		require.NoError(t, r.a.PostSend([]verbs.SendWR{{
			ID: 7, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 0x01020304,
			SGL:        []verbs.SGE{{Addr: r.mrA.Addr(), Length: 5, LKey: r.mrA.LKey()}, {Addr: r.mrA.Addr() + 5, Length: 6, LKey: r.mrA.LKey()}},
			RemoteAddr: r.mrB.Addr() + 100, RKey: r.mrB.RKey(),
		}}))

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got, err := r.ch.Wait(ctx)
		require.NoError(t, err)
		require.Same(t, r.cqB, got, "Wait returned the wrong CQ")

		wc := pollOne(t, r.cqB)
		require.Equal(t, verbs.WorkCompletion{
			WRID: 42, Status: verbs.WCSuccess, Opcode: verbs.WCRecvRDMAWithImm, ByteLen: 11,
			Imm: 0x01020304, QPN: r.b.QPN(), SrcQP: r.a.QPN(), Flags: verbs.WCWithImm,
		}, wc)
		require.Equal(t, "hello, rdma", string(r.mrB.Bytes()[100:111]))

		wc = pollOne(t, r.cqA)
		require.NoError(t, wc.Err())
		require.Equal(t, verbs.WCRDMAWrite, wc.Opcode)
		require.Equal(t, uint64(7), wc.WRID)
		// The double decodes imm_data with ntohl and reports it here: equal to the host
		// value only if it left Go in network byte order.
		require.Equal(t, uint32(0x01020304), wc.VendorErr)
	})

	t.Run("send, inline, read", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 2, MaxInlineData: 64})
		defer r.close(t)
		copy(r.mrA.Bytes(), "inline payload")
		require.NoError(t, r.b.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{
			{Addr: r.mrB.Addr(), Length: 4, LKey: r.mrB.LKey()},
			{Addr: r.mrB.Addr() + 1000, Length: 100, LKey: r.mrB.LKey()},
		}}}))
		require.NoError(t, r.a.PostSend([]verbs.SendWR{{
			ID: 2, Opcode: verbs.OpSendWithImm, Flags: verbs.SendSignaled | verbs.SendInline, Imm: 0xdeadbeef,
			SGL: []verbs.SGE{{Addr: r.mrA.Addr(), Length: 14}}, // inline: no LKey needed
		}}))
		wc := pollOne(t, r.cqB)
		require.Equal(t, verbs.WCRecv, wc.Opcode)
		require.Equal(t, uint32(0xdeadbeef), wc.Imm)
		require.Equal(t, uint32(14), wc.ByteLen)
		require.Equal(t, "inli", string(r.mrB.Bytes()[:4]))
		require.Equal(t, "ne payload", string(r.mrB.Bytes()[1000:1010]))
		require.Equal(t, uint32(0xdeadbeef), pollOne(t, r.cqA).VendorErr)

		copy(r.mrB.Bytes()[2000:], "remote bytes")
		require.NoError(t, r.a.PostSend([]verbs.SendWR{{
			ID: 3, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
			SGL:        []verbs.SGE{{Addr: r.mrA.Addr() + 500, Length: 12, LKey: r.mrA.LKey()}},
			RemoteAddr: r.mrB.Addr() + 2000, RKey: r.mrB.RKey(),
		}}))
		wc = pollOne(t, r.cqA)
		require.Equal(t, verbs.WorkCompletion{WRID: 3, Opcode: verbs.WCRDMARead, ByteLen: 12, QPN: r.a.QPN()}, wc)
		require.Equal(t, "remote bytes", string(r.mrA.Bytes()[500:512]))
	})

	t.Run("post errors", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64})
		defer r.close(t)
		sge := []verbs.SGE{{Addr: r.mrA.Addr(), Length: 1, LKey: r.mrA.LKey()}}
		two := []verbs.SGE{sge[0], sge[0]}

		var pe *verbs.PostError
		err := r.a.PostSend([]verbs.SendWR{
			{ID: 1, Opcode: verbs.OpRDMAWrite, SGL: sge, RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey()},
			{ID: 2, Opcode: verbs.OpRDMAWrite, SGL: two, RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey()},
		})
		require.ErrorAs(t, err, &pe)
		require.Equal(t, 1, pe.Index)
		require.ErrorIs(t, err, verbs.ErrInvalidArgument)

		err = r.a.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendInline, SGL: []verbs.SGE{{Length: 65}}}})
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, "inline longer than granted")

		err = r.a.PostSend([]verbs.SendWR{{Opcode: verbs.Opcode(9)}})
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, "unknown opcode")

		// The receive queue holds 4: the fifth is refused by the device with ENOMEM.
		recvs := make([]verbs.RecvWR, 6)
		err = r.b.PostRecv(recvs)
		require.ErrorAs(t, err, &pe)
		require.Equal(t, 4, pe.Index)
		require.ErrorIs(t, err, verbs.ErrQueueFull)

		// A QP not yet connected cannot send.
		q, err := r.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cqA, RecvCQ: r.cqA, Caps: verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1}})
		require.NoError(t, err)
		err = q.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend}})
		require.ErrorIs(t, err, verbs.ErrInvalidState)
		err = q.PostRecv([]verbs.RecvWR{{}})
		require.ErrorIs(t, err, verbs.ErrInvalidState, "receive in RESET")
		require.ErrorIs(t, q.ToRTS(verbs.RTSAttr{}), verbs.ErrInvalidState, "RESET to RTS")
		require.NoError(t, q.Close())
		require.ErrorIs(t, q.Close(), verbs.ErrClosed)
	})

	t.Run("batches", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 300, MaxRecvWR: 300, MaxSendSGE: 1, MaxRecvSGE: 1})
		defer r.close(t)
		const n = 150 // more than postBatch: posted in three calls
		recvs := make([]verbs.RecvWR, n)
		sends := make([]verbs.SendWR, n)
		for i := range n {
			recvs[i].ID = uint64(i)
			sends[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpRDMAWriteWithImm, Imm: uint32(i),
				RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey()}
		}
		sends[n-1].Flags = verbs.SendSignaled
		require.NoError(t, r.b.PostRecv(recvs))
		require.NoError(t, r.a.PostSend(sends))
		wc := make([]verbs.WorkCompletion, 200)
		got, err := r.cqB.Poll(wc)
		require.NoError(t, err)
		require.Equal(t, n, got)
		for i := range n {
			if wc[i].WRID != uint64(i) || wc[i].Imm != uint32(i) {
				t.Fatalf("completion %d = %+v", i, wc[i])
			}
		}
		got, err = r.cqA.Poll(wc)
		require.NoError(t, err)
		require.Equal(t, 1, got, "only the signaled send completes")
	})

	t.Run("no allocations", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64})
		defer r.close(t)
		recv := []verbs.RecvWR{{ID: 1}}
		send := []verbs.SendWR{{ID: 2, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled | verbs.SendInline,
			SGL: []verbs.SGE{{Addr: r.mrA.Addr(), Length: 8}}, RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey()}}
		wc := make([]verbs.WorkCompletion, 4)
		allocs := testing.AllocsPerRun(100, func() {
			if r.b.PostRecv(recv) != nil || r.a.PostSend(send) != nil {
				panic("post failed")
			}
			if n, _ := r.cqB.Poll(wc); n != 1 {
				panic("no receive completion")
			}
			if n, _ := r.cqA.Poll(wc); n != 1 {
				panic("no send completion")
			}
		})
		require.Zero(t, allocs, "allocations per post and poll")
	})

	// The work requests rsock's engine posts, as it posts them: a zero-length credit
	// update, a write split at the ring's end into two requests of which only the
	// last is signaled, a large write from the staging buffer, receive WQEs without a
	// buffer re-posted one at a time, and polls of a full batch.
	t.Run("no allocations: the engine's requests", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64})
		defer r.close(t)
		write := func(flags verbs.SendFlags, off, n uint32) verbs.SendWR {
			w := verbs.SendWR{ID: uint64(off) + 1, Opcode: verbs.OpRDMAWriteWithImm, Flags: flags, Imm: n,
				RemoteAddr: r.mrB.Addr() + uint64(off), RKey: r.mrB.RKey()}
			if n > 0 {
				w.SGL = []verbs.SGE{{Addr: r.mrA.Addr() + uint64(off), Length: n, LKey: r.mrA.LKey()}}
			}
			return w
		}
		for _, tt := range []struct {
			name  string
			sends []verbs.SendWR
			// signaled is how many of sends complete on the sender's CQ.
			signaled int
		}{
			{"credit update", []verbs.SendWR{write(verbs.SendSignaled, 0, 0)}, 1},
			{"unsignaled credit update", []verbs.SendWR{write(0, 0, 0), write(verbs.SendSignaled, 0, 0)}, 1},
			{"inline write", []verbs.SendWR{write(verbs.SendSignaled|verbs.SendInline, 0, 64)}, 1},
			{"split write", []verbs.SendWR{write(0, 3072, 1024), write(verbs.SendSignaled, 0, 2048)}, 1},
			{"large write", []verbs.SendWR{write(verbs.SendSignaled, 0, 4096)}, 1},
		} {
			var recv [1]verbs.RecvWR
			wc := make([]verbs.WorkCompletion, 64)
			allocs := testing.AllocsPerRun(100, func() {
				for i := range tt.sends {
					recv[0].ID = uint64(i)
					if r.b.PostRecv(recv[:]) != nil {
						panic("post recv failed")
					}
				}
				if r.a.PostSend(tt.sends) != nil {
					panic("post send failed")
				}
				if n, _ := r.cqB.Poll(wc); n != len(tt.sends) {
					panic(fmt.Sprintf("%s: %d receive completions, want %d", tt.name, n, len(tt.sends)))
				}
				if n, _ := r.cqA.Poll(wc); n != tt.signaled {
					panic(fmt.Sprintf("%s: %d send completions, want %d", tt.name, n, tt.signaled))
				}
			})
			require.Zero(t, allocs, "%s: allocations per post and poll", tt.name)
		}
	})

	// A poller arms its CQ and waits on the channel, again and again with one
	// cancellable context: none of that may allocate (a context.AfterFunc per Wait did).
	t.Run("no allocations: arm and wait", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64})
		defer r.close(t)
		recv := []verbs.RecvWR{{ID: 1}}
		send := []verbs.SendWR{{ID: 2, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled | verbs.SendInline,
			SGL: []verbs.SGE{{Addr: r.mrA.Addr(), Length: 8}}, RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey()}}
		wc := make([]verbs.WorkCompletion, 4)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		allocs := testing.AllocsPerRun(100, func() {
			if r.b.PostRecv(recv) != nil || r.cqB.ReqNotify(false) != nil || r.a.PostSend(send) != nil {
				panic("post or arm failed")
			}
			if cq, err := r.ch.Wait(ctx); err != nil || cq != r.cqB {
				panic(fmt.Sprintf("wait = %v, %v", cq, err))
			}
			if n, _ := r.cqB.Poll(wc); n != 1 {
				panic("no receive completion")
			}
			if n, _ := r.cqA.Poll(wc); n != 1 {
				panic("no send completion")
			}
		})
		require.Zero(t, allocs, "allocations per arm, wait and poll")
		// The cancellation stays wired: cancelling wakes a Wait with nothing to wait for.
		cancel()
		_, err := r.ch.Wait(ctx)
		require.ErrorIs(t, err, context.Canceled)
	})

	t.Run("concurrent post, poll and wait", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1})
		defer r.close(t)
		const n = 2000
		recvs := make([]verbs.RecvWR, 32)
		require.NoError(t, r.b.PostRecv(recvs))
		credits := make(chan struct{}, 32)
		for range 32 {
			credits <- struct{}{}
		}
		errc := make(chan error, 2)
		go func() { // sender: one write with immediate per receive credit
			wc := make([]verbs.WorkCompletion, 8)
			for i := range n {
				<-credits
				flags := verbs.SendFlags(0)
				if i%8 == 7 {
					flags = verbs.SendSignaled
				}
				err := r.a.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: verbs.OpRDMAWriteWithImm, Flags: flags,
					Imm: uint32(i), RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey()}})
				if err != nil {
					errc <- err
					return
				}
				if _, err := r.cqA.Poll(wc); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		go func() { // receiver: arm, poll once more, wait; repost each receive
			wc := make([]verbs.WorkCompletion, 16)
			next := 0
			for next < n {
				if err := r.cqB.ReqNotify(false); err != nil {
					errc <- err
					return
				}
				got, err := r.cqB.Poll(wc)
				if err != nil {
					errc <- err
					return
				}
				if got == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err = r.ch.Wait(ctx)
					cancel()
					if err != nil {
						errc <- err
						return
					}
					continue
				}
				for _, c := range wc[:got] {
					if c.Imm != uint32(next) || c.Status != verbs.WCSuccess {
						errc <- fmt.Errorf("completion %d: %+v", next, c)
						return
					}
					next++
				}
				if err := r.b.PostRecv(recvs[:got]); err != nil {
					errc <- err
					return
				}
				for range got {
					credits <- struct{}{}
				}
			}
			errc <- nil
		}()
		for range 2 {
			require.NoError(t, <-errc)
		}
		// Drain events left by the arming above, so the CQs close cleanly.
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			_, err := r.ch.Wait(ctx)
			cancel()
			if err != nil {
				break
			}
		}
	})

	t.Run("wait: cancelled as it starts", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		defer r.close(t)
		ch := r.ch.(*compChannel)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// A first Wait with ctx, ended by an event: ctx's cancellation is watched from
		// then on, as a poller's is across its Waits.
		require.NoError(t, r.b.PostRecv([]verbs.RecvWR{{ID: 1}}))
		require.NoError(t, r.cqB.ReqNotify(false))
		require.NoError(t, r.a.PostSend([]verbs.SendWR{{Opcode: verbs.OpRDMAWriteWithImm,
			RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey()}}))
		got, err := r.ch.Wait(ctx)
		require.NoError(t, err)
		require.Same(t, r.cqB, got)
		pollOne(t, r.cqB)

		// The next Wait is cancelled just after its first look at ctx, and the watch's
		// interrupt runs before Wait clears the deadline (the watch itself is taken
		// off, so that only this interrupt can end the Wait).
		testHookWaitStarts = func(ch *compChannel) {
			ch.stopWatch()
			cancel()
			ch.interrupt()
		}
		defer func() { testHookWaitStarts = nil }()
		done := make(chan error, 1)
		go func() { _, err := r.ch.Wait(ctx); done <- err }()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(10 * time.Second):
			ch.interrupt() // let the Wait go, for the rig's close
			t.Fatal("a Wait cancelled as it started never returned")
		}
	})

	t.Run("wait: cancel, close", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		defer r.close(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		_, err := r.ch.Wait(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)

		// After a cancellation the channel still delivers.
		require.NoError(t, r.b.PostRecv([]verbs.RecvWR{{ID: 1}}))
		require.NoError(t, r.cqB.ReqNotify(true)) // solicited only: the write below is
		require.NoError(t, r.a.PostSend([]verbs.SendWR{{Opcode: verbs.OpRDMAWriteWithImm,
			Flags: verbs.SendSolicited, RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey()}}))
		got, err := r.ch.Wait(context.Background())
		require.NoError(t, err)
		require.Same(t, r.cqB, got)
		pollOne(t, r.cqB)

		// Close wakes a Wait on an idle channel.
		idle, err := r.ctx.CreateCompChannel()
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { _, err := idle.Wait(context.Background()); done <- err }()
		// Gives Wait time to park in the C double's poll(2), which synctest cannot
		// observe. The assertion below holds whichever comes first, Wait or Close:
		// the sleep only makes the interesting order (Close wakes a parked Wait) likely.
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, idle.Close())
		select {
		case err := <-done:
			require.ErrorIs(t, err, verbs.ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not wake Wait")
		}
		_, err = idle.Wait(context.Background())
		require.ErrorIs(t, err, verbs.ErrClosed)
	})

	t.Run("errors reach the QP and CQ", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
		defer r.close(t)
		require.NoError(t, r.b.PostRecv([]verbs.RecvWR{{ID: 9}}))
		require.NoError(t, r.a.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpRDMAWrite,
			SGL:        []verbs.SGE{{Addr: r.mrA.Addr(), Length: 8, LKey: r.mrA.LKey()}},
			RemoteAddr: r.mrB.Addr(), RKey: r.mrB.RKey() + 100}}))
		wc := pollOne(t, r.cqA)
		require.Equal(t, verbs.WCRemAccessErr, wc.Status)
		var we *verbs.WCError
		require.ErrorAs(t, wc.Err(), &we)
		require.Equal(t, verbs.QPStateError, r.a.State(), "State asks the device")

		require.NoError(t, r.b.ToError())
		wc = pollOne(t, r.cqB)
		require.Equal(t, verbs.WorkCompletion{WRID: 9, Status: verbs.WCWRFlushErr, QPN: r.b.QPN()}, wc)
		require.NoError(t, r.b.ToReset())
		require.Equal(t, verbs.QPStateReset, r.b.State())

		// A CQ of one entry overflows on the second completion; the async event
		// reader marks it.
		small, err := r.ctx.CreateCQ(1, nil, 0)
		require.NoError(t, err)
		q, err := r.pd.CreateQP(verbs.QPInitAttr{SendCQ: small, RecvCQ: small, SignalAll: true,
			Caps: verbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4}})
		require.NoError(t, err)
		require.NoError(t, q.ToInit(verbs.InitAttr{Port: 1}))
		require.NoError(t, q.ToError())
		require.NoError(t, q.PostSend([]verbs.SendWR{{ID: 1}, {ID: 2}})) // flushed: two completions
		var one [1]verbs.WorkCompletion
		// Polls (real time: the C double's async event thread) for the overflow that must come.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			_, err := small.Poll(one[:])
			if errors.Is(err, verbs.ErrCQOverflow) {
				break
			}
			require.NoError(t, err)
			if time.Now().After(deadline) {
				t.Fatal("CQ overflow not reported")
			}
		}
		require.ErrorIs(t, small.ReqNotify(false), verbs.ErrCQOverflow)
		// The same event reaches WaitAsyncEvent, acknowledged, naming the CQ.
		evCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ev, err := r.ctx.WaitAsyncEvent(evCtx)
		cancel()
		require.NoError(t, err)
		require.Equal(t, verbs.EventCQErr, ev.Type)
		require.Same(t, small.(*cq), ev.CQ.(*cq))
		_, err = r.ctx.CreateCQ(4, nil, r.ctx.Device().NumCompVectors)
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, "a completion vector beyond the device's")
		require.NoError(t, q.Close())
		require.NoError(t, small.Close())
	})

	t.Run("close order", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1})
		require.ErrorIs(t, r.ctx.Close(), verbs.ErrBusy)
		require.ErrorIs(t, r.pd.Close(), verbs.ErrBusy)
		require.ErrorIs(t, r.cqA.Close(), verbs.ErrBusy)
		require.ErrorIs(t, r.ch.Close(), verbs.ErrBusy)
		r.close(t)
		require.ErrorIs(t, r.mrA.Close(), verbs.ErrClosed)
		require.ErrorIs(t, r.ctx.Close(), verbs.ErrClosed)
		_, err := r.ctx.AllocPD()
		require.ErrorIs(t, err, verbs.ErrClosed)
	})

	t.Run("invalid arguments", func(t *testing.T) {
		r := newFakeRig(t, verbs.QPCaps{MaxSendWR: 1, MaxRecvWR: 1})
		defer r.close(t)
		_, err := r.pd.RegMR(0, verbs.AccessLocalWrite)
		require.ErrorIs(t, err, verbs.ErrInvalidArgument)
		_, err = r.pd.RegMR(64, verbs.AccessRemoteWrite)
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, "remote write without local write")
		_, err = r.ctx.CreateCQ(0, nil, 0)
		require.ErrorIs(t, err, verbs.ErrInvalidArgument)
		_, err = r.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cqA, Caps: verbs.QPCaps{MaxSendSGE: 99}})
		require.ErrorIs(t, err, verbs.ErrInvalidArgument)
		_, err = r.pd.CreateQP(verbs.QPInitAttr{SendCQ: (*cq)(nil), RecvCQ: r.cqA})
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, "typed nil CQ")
		_, err = r.ctx.CreateCQ(4, (*compChannel)(nil), 0)
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, "typed nil channel")
		_, err = r.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cqA, RecvCQ: r.cqA, Caps: verbs.QPCaps{MaxSendSGE: 99}})
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, "the device refuses: EINVAL from create")
		require.Contains(t, err.Error(), "ibv: create qp: invalid argument (EINVAL)")
		_, err = r.ctx.QueryPort(2)
		require.ErrorIs(t, err, verbs.ErrInvalidArgument)
		port, err := r.ctx.QueryPort(1)
		require.NoError(t, err)
		require.Equal(t, verbs.PortActive, port.State)
		m, err := r.pd.RegMR(10, verbs.AccessLocalWrite)
		require.NoError(t, err)
		require.Len(t, m.Bytes(), 10)
		require.True(t, bytes.Equal(m.Bytes(), make([]byte, 10)))
		require.NoError(t, m.Close())
	})
}

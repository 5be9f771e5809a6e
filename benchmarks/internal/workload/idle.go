package workload

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/rsockio/rsock/verbs/soft"
)

// IdleResult is the footprint of idle connections.
type IdleResult struct {
	Transport string
	Conns     int
	// Ends is how many ends of each connection live in this process: 2 when the server
	// runs here too ([Start]), 1 for a client of another process.
	Ends int
	// Setup is how long opening the connections took.
	Setup time.Duration
	// Per connection end: the live heap (after a GC; on verbs/soft it includes the
	// registered memory, which soft allocates from the heap), the memory registered for
	// RDMA (-1 when the transport does not count it), open files and goroutines.
	HeapPerEnd       float64
	StackPerEnd      float64 // goroutine stacks
	RegisteredPerEnd float64
	FilesPerEnd      float64
	GoroutinesPerEnd float64
	// Totals for all the connections.
	HeapTotal       int64
	StackTotal      int64
	RegisteredTotal int64
	Files           int
	Goroutines      int
	// SoftQPs and SoftMRs are the QPs and MRs the connections hold on RsockRDMA's soft
	// fabric, if any.
	SoftQPs, SoftMRs int
	// Capped, if not empty, says why fewer connections than asked were opened: the
	// process's limit of open files (Conns is then how many were).
	Capped string `json:",omitempty"`
}

// footprint is the process's use of what IdleResult counts.
type footprint struct {
	heap, stack     int64
	registered      int64
	files, routines int
}

// openFiles counts the process's open files, or returns -1 where /proc says nothing.
func openFiles() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(fds)
}

// connsWithinFiles returns how many of n connections, perConn open files each, fit in
// room more files. A connection on shared memory opens several (its socket, its QP's
// Unix socket and connection, a memfd per region), and 5,000 of them, both ends in one
// process, passed an RLIMIT_NOFILE of 20,000, which fails a run rather than measure it.
func connsWithinFiles(n, perConn, room int) int {
	if perConn <= 0 || n*perConn <= room {
		return n
	}
	return max(room/perConn, 0)
}

// fileRoom is how many more files the process may open, keeping a margin for what the
// measurement itself opens (a twentieth of the limit, at least 64); ok is false when
// the limit or the count is unknown.
func fileRoom() (room, limit int, ok bool) {
	var rl syscall.Rlimit
	open := openFiles()
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || open < 0 || rl.Cur > math.MaxInt32 {
		return 0, 0, false
	}
	limit = int(rl.Cur)
	return limit - open - max(limit/20, 64), limit, true
}

func measureFootprint(env *Env) footprint {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	f := footprint{heap: int64(m.HeapAlloc), stack: int64(m.StackInuse), routines: runtime.NumGoroutine()}
	f.registered, _ = env.RegisteredBytes()
	f.files = max(openFiles(), 0)
	return f
}

// Idle opens n connections to env's server, waits until the server (if it runs here)
// has them all in hand, measures the footprint they add, and closes them. progress, if
// set, is called now and then with the number opened so far.
func Idle(env *Env, n int, progress func(opened int)) (IdleResult, error) {
	r := IdleResult{Transport: env.Transport.Name, Conns: n, Ends: 1, RegisteredPerEnd: -1}
	if env.Transport.Raw || n < 1 {
		return r, fmt.Errorf("idle: %s with %d connections: nothing to measure", env.Transport.Name, n)
	}
	srv := env.Server()
	if srv != nil {
		r.Ends = 2
	}
	openIdle := func() (net.Conn, error) { return env.open(context.Background(), roleIdle, 0) }
	// One connection stays open throughout, so that what the first connection sets up
	// for all (an RDMA device's context, protection domain and completion queue, say)
	// is not counted per connection.
	first, err := openMany(1, openIdle)
	if err != nil {
		return r, err
	}
	defer closeAll(first)
	if srv != nil {
		if err := waitIdle(srv, 1); err != nil {
			return r, err
		}
	}
	// A second connection that also stays open tells how many files each opens (the
	// first opened the device's too), so that no more are opened than the process's
	// limit of open files allows.
	held := 1
	if room, limit, ok := fileRoom(); ok && n > 1 {
		filesBefore := openFiles()
		probe, err := openMany(1, openIdle)
		if err != nil {
			return r, err
		}
		defer closeAll(probe)
		held++
		if srv != nil {
			if err := waitIdle(srv, held); err != nil {
				return r, err
			}
		}
		perConn := openFiles() - filesBefore
		if capped := connsWithinFiles(n, perConn, room-perConn); capped < n {
			if capped < 1 {
				return r, fmt.Errorf("idle: %s: no room for a connection of %d open files under RLIMIT_NOFILE %d", env.Transport.Name, perConn, limit)
			}
			r.Capped = fmt.Sprintf("%s: %d of %d connections, %d open files each within RLIMIT_NOFILE %d", env.Transport.Name, capped, n, perConn, limit)
			n, r.Conns = capped, capped
		}
	}
	settle()
	before := measureFootprint(env)
	var softBefore soft.Stats
	if f := env.Fabric(); f != nil {
		softBefore = f.Stats()
	}
	start := time.Now()
	stopProgress := func() {}
	if progress != nil && srv != nil {
		stopProgress = every(time.Second, func() { progress(int(srv.IdleConns())) })
	}
	conns, err := openMany(n, openIdle)
	if err != nil {
		stopProgress()
		return r, err
	}
	defer closeAll(conns)
	if srv != nil {
		if err := waitIdle(srv, n+held); err != nil {
			stopProgress()
			return r, err
		}
	}
	stopProgress()
	r.Setup = time.Since(start)
	after := measureFootprint(env)
	if f := env.Fabric(); f != nil {
		s := f.Stats()
		r.SoftQPs, r.SoftMRs = s.QPs-softBefore.QPs, s.MRs-softBefore.MRs
	}
	ends := float64(n * r.Ends)
	r.HeapTotal = after.heap - before.heap
	r.HeapPerEnd = float64(r.HeapTotal) / ends
	r.StackTotal = after.stack - before.stack
	r.StackPerEnd = float64(r.StackTotal) / ends
	if _, ok := env.RegisteredBytes(); ok {
		r.RegisteredTotal = after.registered - before.registered
		r.RegisteredPerEnd = float64(r.RegisteredTotal) / ends
	}
	r.Files = after.files - before.files
	r.FilesPerEnd = float64(r.Files) / ends
	r.Goroutines = after.routines - before.routines
	r.GoroutinesPerEnd = float64(r.Goroutines) / ends
	return r, nil
}

// waitIdle waits until srv holds n idle connections.
func waitIdle(srv *Server, n int) error {
	deadline := time.Now().Add(time.Minute)
	for srv.IdleConns() < int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("idle: the server has %d of %d connections after a minute", srv.IdleConns(), n)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// settle waits, for at most 10 s, until the number of goroutines stops falling: until
// connections closed earlier (a QUIC connection lingers a little) have let go of what
// they held, which would otherwise be counted against the connections measured next.
func settle() {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n := runtime.NumGoroutine()
		time.Sleep(100 * time.Millisecond)
		if runtime.NumGoroutine() >= n {
			return
		}
	}
}

// every calls f every period until stop is called; stop returns once f has returned.
func every(period time.Duration, f func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				f()
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

package soft

import "sync/atomic"

// teardownModel selects how a fabric's devices treat a destroyed QP, where devices
// differ and the difference can hide bugs: see LeaveDestroyedCompletions and
// ReuseQPNs.
type teardownModel struct {
	leaveCompletions atomic.Bool
	reuseQPNs        atomic.Bool
}

// LeaveDestroyedCompletions sets whether destroying a QP leaves the completions it
// generated and nobody polled yet (its flushed WRs, typically) in its CQs, as rxe
// does, instead of removing them, as mlx5 does. Polling them later returns
// completions that name a QP number no live QP has, or, with ReuseQPNs, a number a
// new QP has. Off by default.
func (f *Fabric) LeaveDestroyedCompletions(on bool) { f.teardown.leaveCompletions.Store(on) }

// ReuseQPNs sets whether a new QP takes the lowest free QP number, so that a QP
// created after one is destroyed gets its number, as devices whose QP table hands out
// free numbers first do. Off by default: numbers are handed out in increasing order
// and wrap around after 2^24.
func (f *Fabric) ReuseQPNs(on bool) { f.teardown.reuseQPNs.Store(on) }

package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
)

// This file models the network between two GIDs: a path can be unreachable, as when a
// firewall drops RoCE v2's UDP port 4791 or the route leads to another device, or lossy.
// Everything else about the two devices stays as it was: their QPs reach RTS, and only
// the requests that cross the path are lost, which the requester sees as a loss (it
// retransmits after its ACK timeout and, once its retry count is spent, completes the
// request with RETRY_EXC_ERR and moves to ERROR). That is how a configured but broken
// path looks on real fabrics, and what rsock's proof of the path must catch.
//
// A request crosses the path between the source GID of its QP's address vector (the
// port's GID table entry SGIDIndex names) and the destination GID, in either direction.
// Paths are independent of BreakLink, which breaks every path between two devices.

// Path is the behaviour of the network between two GIDs. The zero Path is a lossless
// one.
type Path struct {
	// Unreachable loses every request between the two GIDs.
	Unreachable bool
	// DropEvery, if positive, loses every DropEvery-th request between the two GIDs
	// (counting both directions, transmissions and retransmissions alike); 1 is
	// Unreachable. The requester's retransmissions get its requests through, later.
	DropEvery int
}

// pathTable holds the paths set with SetPath; its zero value has none.
type pathTable struct {
	mu    sync.RWMutex
	paths map[[2]verbs.GID]*pathState
}

// pathState is a path and its request counter.
type pathState struct {
	Path
	seen atomic.Uint64 // requests that met the path
}

// SetPath sets the path between GIDs a and b, in both directions, for requests posted or
// retransmitted from now on. The zero Path restores a lossless one. a and b need not
// belong to a device of the fabric: a request to a GID no device has is lost anyway.
func (f *Fabric) SetPath(a, b verbs.GID, p Path) error {
	if p.DropEvery < 0 {
		return fmt.Errorf("soft: set path %v-%v: DropEvery %d: %w", a, b, p.DropEvery, verbs.ErrInvalidArgument)
	}
	f.faultsUsed.Store(true)
	key := pathKey(a, b)
	t := &f.paths
	t.mu.Lock()
	defer t.mu.Unlock()
	if p == (Path{}) {
		delete(t.paths, key)
		return nil
	}
	if t.paths == nil {
		t.paths = make(map[[2]verbs.GID]*pathState)
	}
	s := &pathState{Path: p}
	t.paths[key] = s
	return nil
}

func pathKey(a, b verbs.GID) [2]verbs.GID {
	for i := range a {
		if a[i] != b[i] {
			if a[i] > b[i] {
				a, b = b, a
			}
			break
		}
	}
	return [2]verbs.GID{a, b}
}

// pathLoses reports whether the path q's next request crosses loses it. The caller holds
// q.sq.mu and has checked that faults are in use.
func (f *Fabric) pathLoses(q *QP) bool {
	t := &f.paths
	t.mu.RLock()
	defer t.mu.RUnlock()
	if len(t.paths) == 0 {
		return false
	}
	src, ok := q.dev.gid(q.sq.av.SGIDIndex)
	if !ok {
		return false
	}
	s := t.paths[pathKey(src, q.sq.av.DestGID)]
	switch {
	case s == nil:
		return false
	case s.Unreachable:
		return true
	case s.DropEvery > 0:
		return s.seen.Add(1)%uint64(s.DropEvery) == 0
	}
	return false
}

// gid returns the GID of the port's table entry with hardware index i.
func (d *device) gid(i uint8) (verbs.GID, bool) {
	for _, e := range d.attr.Ports[0].GIDs {
		if e.Index == int(i) {
			return e.GID, true
		}
	}
	return verbs.GID{}, false
}

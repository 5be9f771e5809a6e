package shm

import (
	"sync"

	"golang.org/x/sys/unix"

	"github.com/rsockio/rsock/internal/vma"
)

// Memory mappings, counted against rsock's share of the process's limit
// (vm.max_map_count; internal/vma), past which the Go runtime's own next mmap would be
// refused and the process die. A region's memory (RegMR) is counted when it is made.
// A QP's connections map more after the connection is up: the channel it dials its
// peer with, the channel its peer dials it with (each made again on a reconnection),
// and the peer's region it writes into, when the first WR names it. Refused then, a
// connection already handed to the application would fail mid-stream. So a QP reserves
// those mappings when it is created (qpMappings: CreateQP fails, and a connection falls
// back, before it starts), and its connections map against the reservation (a
// mapQuota), one more included for a reconnection made while the old connection's
// channel is still being unmapped. Mappings beyond it (both ends reconnecting at once
// while both old channels linger, a flood of inbound connections) are counted one by
// one, and may be refused.
//
// A QP keeps at most one of its peer's regions mapped (peerConn.addRegion): rsock's
// engine writes into one ring of its peer's at a time, and moves to the next for good
// when the peer's ring grows or shrinks. Kept, every ring the peer had left behind stayed
// mapped here until the connection closed, a mapping each and the ring's memory with
// it, since the peer's deregistering a region does not unmap it here. A user of the
// provider that alternates WRs between two regions of one peer pays a region query and
// a mapping at each switch.

// qpMappings is how many mappings a QP reserves: the two channels, one region, and a
// reconnection's new channel while the old one lingers.
const qpMappings = 4

// mapQuota is the mappings a QP reserved and those its connections made against them.
type mapQuota struct {
	mu       sync.Mutex
	reserved int // qpMappings while the QP lives, 0 after (close)
	live     int // made against it and not yet unmapped
}

// open reserves the QP's mappings.
func (m *mapQuota) open() error {
	if err := vma.Reserve(qpMappings); err != nil {
		return err
	}
	m.mu.Lock()
	m.reserved = qpMappings
	m.mu.Unlock()
	return nil
}

// take counts a mapping about to be made: within the reservation, or else counted
// against the process's share, which may refuse it.
func (m *mapQuota) take() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live >= m.reserved {
		if err := vma.Reserve(1); err != nil {
			return err
		}
	}
	m.live++
	return nil
}

// give uncounts a mapping take counted, once unmapped (or not made after all).
func (m *mapQuota) give() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.live--
	if m.live >= m.reserved {
		vma.Release(1)
	}
}

// close gives back the reservation, but for the mappings still made against it, which
// are then counted one by one until unmapped: the process's count is
// max(reserved, live) before and live after.
func (m *mapQuota) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reserved > m.live {
		vma.Release(m.reserved - m.live)
	}
	m.reserved = 0
}

// mapShared maps the first size bytes of fd shared, counted against quota, or against
// the process's share when quota is nil: refused, it fails with an error that matches
// verbs.ErrNoResources and maps nothing.
func mapShared(fd, size, prot int, quota *mapQuota) ([]byte, error) {
	if quota != nil {
		if err := quota.take(); err != nil {
			return nil, err
		}
	} else if err := vma.Reserve(1); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, size, prot, unix.MAP_SHARED)
	if err != nil {
		uncount(quota)
		return nil, err
	}
	return mem, nil
}

// unmap ends a mapping mapShared made with quota, given whole or resliced from its
// start. A mapping munmap refuses stays mapped, and counted.
func unmap(mem []byte, quota *mapQuota) {
	if cap(mem) > 0 && unix.Munmap(mem[:cap(mem)]) == nil {
		uncount(quota)
	}
}

func uncount(quota *mapQuota) {
	if quota != nil {
		quota.give()
	} else {
		vma.Release(1)
	}
}

package auto

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/shm"
)

// SameHost returns the provider for connections whose two ends run on this host: the
// shared-memory provider (verbs/shm), one for the process, created on first use and
// kept for the life of the process. It holds no goroutine and no descriptor while it
// has no QP. A call that fails to create it (a process out of file descriptors)
// returns the error, and the next call tries again.
func SameHost() (verbs.Provider, error) { return sameHost.get() }

// sameHostProvider makes the same-host provider once it can: a provider made is kept,
// a failure is not. Making it lists the host's interfaces, which takes a descriptor,
// so a process out of file descriptors fails to (EMFILE) until it has some again;
// remembering that failure, as a sync.Once would, turned shared memory off for the
// rest of the process.
type sameHostProvider struct {
	p      atomic.Pointer[shm.Provider]
	mu     sync.Mutex // serializes making it
	create func() (*shm.Provider, error)
}

var sameHost = sameHostProvider{create: func() (*shm.Provider, error) { return shm.New(shm.Options{}) }}

// get returns the provider, made now if it was not yet.
func (s *sameHostProvider) get() (verbs.Provider, error) {
	if p := s.p.Load(); p != nil {
		return p, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.p.Load(); p != nil {
		return p, nil
	}
	p, err := s.create()
	if err != nil {
		return nil, fmt.Errorf("auto: same-host provider: %w", err)
	}
	s.p.Store(p)
	return p, nil
}

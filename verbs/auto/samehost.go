package auto

import (
	"fmt"
	"sync"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/shm"
)

var sameHost struct {
	once sync.Once
	p    verbs.Provider
	err  error
}

// SameHost returns the provider for connections whose two ends run on this host: the
// shared-memory provider (verbs/shm), one for the process, created on first use and
// kept for the life of the process. It holds no goroutine and no descriptor while it
// has no QP.
func SameHost() (verbs.Provider, error) {
	sameHost.once.Do(func() {
		p, err := shm.New(shm.Options{})
		if err != nil {
			sameHost.err = fmt.Errorf("auto: same-host provider: %w", err)
			return
		}
		sameHost.p = p
	})
	return sameHost.p, sameHost.err
}

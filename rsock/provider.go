package rsock

import (
	"fmt"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/auto"
)

// defaultProvider returns the RDMA provider used when Config.Provider is nil, or an
// error matching ErrNoProvider that says why there is none.
//
// The default is the rdma-core provider when the module is built with -tags rdma and a
// device with an active port exists (package verbs/auto decides, and caches its answer).
func defaultProvider() (verbs.Provider, error) {
	p, err := auto.Default()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoProvider, err)
	}
	return p, nil
}

// provider returns the provider of a resolved Config: its own, or the default.
func (c *Config) provider() (verbs.Provider, error) {
	if c.DisableRDMA {
		if processEnv().disableRDMA { // env.go
			return nil, errRDMADisabledByEnv
		}
		return nil, errRDMADisabled
	}
	if c.Provider != nil {
		return c.Provider, nil
	}
	return defaultProvider()
}

var errRDMADisabled = fmt.Errorf("%w: RDMA disabled by Config.DisableRDMA", ErrNoProvider)

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
	p, err := autoDefault()
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

// autoDefault and autoFresh are verbs/auto's Default and Fresh; tests replace them.
var (
	autoDefault = auto.Default
	autoFresh   = auto.Fresh
)

// providerKnown reports whether provider answers at once: the Config names a provider
// or disables RDMA, or verbs/auto has its answer cached. Otherwise provider probes,
// listing and opening devices, which can take long.
func (c *Config) providerKnown() bool {
	return c.DisableRDMA || c.Provider != nil || autoFresh()
}

var errRDMADisabled = fmt.Errorf("%w: RDMA disabled by Config.DisableRDMA", ErrNoProvider)

package rsock

import (
	"fmt"
	"os"
	"strconv"
	"sync"
)

// EnvDisableRDMA is the environment variable that turns RDMA off in a deployed binary
// without a rebuild: set to 1 (or true), every Listener and Dialer of the process
// behaves as with [Config.DisableRDMA], whatever its Config says, and its connections
// report a fallback reason matching [ErrNoProvider] that names the variable. 0, false or
// empty leave the Config in charge. Any other value fails Listen and Dial, naming it.
//
// The environment is read once, at the first Listen or Dial; later changes to it are
// not seen. The environment wins over the Config because it is the operator's switch:
// the one who runs the binary turns RDMA off (to rule it out while chasing a problem,
// or on a host whose fabric misbehaves), not the one who built it. It can only turn
// RDMA off; no variable turns it on against a Config.
const EnvDisableRDMA = "RSOCK_DISABLE_RDMA"

// envSettings are what the environment says, read once.
type envSettings struct {
	disableRDMA bool
	err         error // a variable set to something it cannot mean
}

// processEnv returns the process environment's settings, read at the first call. Tests
// replace it (never in parallel tests) to try settings without touching the process's
// environment.
var processEnv = sync.OnceValue(func() envSettings { return readEnv(os.LookupEnv) })

// readEnv reads rsock's variables through lookup (os.LookupEnv outside tests).
func readEnv(lookup func(string) (string, bool)) envSettings {
	var s envSettings
	if v, ok := lookup(EnvDisableRDMA); ok && v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.err = fmt.Errorf("%w: environment %s=%q, want 1 or true to disable RDMA, 0 or false not to", ErrInvalidConfig, EnvDisableRDMA, v)
		}
		s.disableRDMA = b
	}
	return s
}

// applyEnv applies the environment's settings to the resolved Config r.
func (r *Config) applyEnv(env envSettings) error {
	if env.err != nil {
		return env.err
	}
	if env.disableRDMA {
		r.DisableRDMA = true // provider() gives errRDMADisabledByEnv as the reason
	}
	return nil
}

// errRDMADisabledByEnv is the fallback reason of connections whose RDMA the environment
// turned off.
var errRDMADisabledByEnv = fmt.Errorf("%w: RDMA disabled by %s in the environment", ErrNoProvider, EnvDisableRDMA)

package rsock

import (
	"errors"
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

// EnvDisableSHM is the environment variable that turns shared memory between two
// processes of one host off (as [Config.DisableSHM] does), read and ruled like
// [EnvDisableRDMA]: 1 or true turns it off whatever the Config says, and same-host
// connections then take a NIC if there is one, else stay on their fallback transport.
const EnvDisableSHM = "RSOCK_DISABLE_SHM"

// envSettings are what the environment says, read once.
type envSettings struct {
	disableRDMA bool
	disableSHM  bool
	err         error // a variable set to something it cannot mean
}

// processEnv returns the process environment's settings, read at the first call. Tests
// replace it (never in parallel tests) to try settings without touching the process's
// environment.
var processEnv = sync.OnceValue(func() envSettings { return readEnv(os.LookupEnv) })

// readEnv reads rsock's variables through lookup (os.LookupEnv outside tests).
func readEnv(lookup func(string) (string, bool)) envSettings {
	var s envSettings
	var errRDMA, errSHM error
	s.disableRDMA, errRDMA = envSwitch(lookup, EnvDisableRDMA, "RDMA")
	s.disableSHM, errSHM = envSwitch(lookup, EnvDisableSHM, "shared memory")
	s.err = errors.Join(errRDMA, errSHM)
	return s
}

// envSwitch reads the boolean variable name: unset or empty is false.
func envSwitch(lookup func(string) (string, bool), name, what string) (bool, error) {
	v, ok := lookup(name)
	if !ok || v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%w: environment %s=%q, want 1 or true to disable %s, 0 or false not to", ErrInvalidConfig, name, v, what)
	}
	return b, nil
}

// applyEnv applies the environment's settings to the resolved Config r.
func (r *Config) applyEnv(env envSettings) error {
	if env.err != nil {
		return env.err
	}
	if env.disableRDMA {
		r.DisableRDMA = true // provider() gives errRDMADisabledByEnv as the reason
	}
	if env.disableSHM {
		r.DisableSHM = true
	}
	return nil
}

// errRDMADisabledByEnv is the fallback reason of connections whose RDMA the environment
// turned off.
var errRDMADisabledByEnv = fmt.Errorf("%w: RDMA disabled by %s in the environment", ErrNoProvider, EnvDisableRDMA)

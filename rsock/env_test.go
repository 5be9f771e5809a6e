package rsock

import (
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

func TestReadEnv(t *testing.T) {
	tests := []struct {
		value   string
		set     bool
		disable bool
		err     string
	}{
		{set: false},
		{value: "", set: true},
		{value: "1", set: true, disable: true},
		{value: "true", set: true, disable: true},
		{value: "TRUE", set: true, disable: true},
		{value: "0", set: true},
		{value: "false", set: true},
		{value: "yes", set: true, err: `invalid Config: environment RSOCK_DISABLE_RDMA="yes", want 1 or true to disable RDMA, 0 or false not to`},
	}
	for _, tt := range tests {
		got := readEnv(func(name string) (string, bool) {
			if name != EnvDisableRDMA {
				return "", false
			}
			return tt.value, tt.set
		})
		require.Equal(t, tt.disable, got.disableRDMA, "readEnv with %s=%q (set %v)", EnvDisableRDMA, tt.value, tt.set)
		if tt.err == "" {
			require.NoError(t, got.err, "readEnv with %s=%q", EnvDisableRDMA, tt.value)
		} else {
			require.ErrorIs(t, got.err, ErrInvalidConfig)
			require.EqualError(t, got.err, tt.err)
		}
	}
}

// withEnv makes the package read its environment from vars for the rest of the test,
// and read it once, as the process does.
func withEnv(t *testing.T, vars map[string]string) {
	old := processEnv
	processEnv = sync.OnceValue(func() envSettings {
		return readEnv(func(name string) (string, bool) { v, ok := vars[name]; return v, ok })
	})
	t.Cleanup(func() { processEnv = old })
}

// TestEnvDisablesRDMA: with RSOCK_DISABLE_RDMA=1, two sides that would upgrade over
// soft RDMA stay on TCP, and the client's reason names the variable; a bad value fails
// Listen and Dial.
func TestEnvDisablesRDMA(t *testing.T) {
	fab := soft.New(soft.Options{})
	scfg, ccfg := rdmaConfigs(t, FallbackTCP, fab)

	withEnv(t, map[string]string{EnvDisableRDMA: "1"})
	ln := listen(t, scfg)
	c, s := pipe(t, ln, ccfg)
	require.Equal(t, TransportTCP, c.Transport())
	require.Equal(t, TransportTCP, s.Transport())
	require.ErrorIs(t, c.FallbackReason(), ErrNoProvider)
	require.EqualError(t, c.FallbackReason(), "rsock: upgrade to rdma: no RDMA provider: RDMA disabled by RSOCK_DISABLE_RDMA in the environment")
	c.Close()
	s.Close()

	withEnv(t, map[string]string{EnvDisableRDMA: "0"})
	c, s = pipe(t, listen(t, scfg), ccfg) // ln's Config was resolved under "1"
	require.Equal(t, TransportRDMA, c.Transport(), "client: %v", c.FallbackReason())
	c.Close()
	s.Close()

	withEnv(t, map[string]string{EnvDisableRDMA: "maybe"})
	_, err := Listen("tcp", "127.0.0.1:0", nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, `RSOCK_DISABLE_RDMA="maybe"`)
	_, err = Dial("tcp", ln.Addr().String(), nil)
	require.ErrorContains(t, err, `RSOCK_DISABLE_RDMA="maybe"`)
}

// TestEnvFromProcess reads the variable from the process environment, as a deployed
// binary does (t.Setenv: this test must not run in parallel).
func TestEnvFromProcess(t *testing.T) {
	t.Setenv(EnvDisableRDMA, "1")
	withEnv(t, nil)
	processEnv = sync.OnceValue(func() envSettings { return readEnv(os.LookupEnv) })
	cfg, err := (&Config{Provider: soft.New(soft.Options{})}).resolve()
	require.NoError(t, err)
	require.True(t, cfg.DisableRDMA, "Config.DisableRDMA after resolve with %s=1", EnvDisableRDMA)
	_, err = cfg.provider()
	require.ErrorIs(t, err, errRDMADisabledByEnv)

	// Read once: a change after the first read is not seen.
	t.Setenv(EnvDisableRDMA, "0")
	cfg, err = (&Config{}).resolve()
	require.NoError(t, err)
	require.True(t, cfg.DisableRDMA, "after the variable changed")
}

// TestReadEnvSHM: RSOCK_DISABLE_SHM is read as RSOCK_DISABLE_RDMA is, on its own.
func TestReadEnvSHM(t *testing.T) {
	tests := []struct {
		vars      map[string]string
		rdma, shm bool
		err       string
	}{
		{vars: map[string]string{EnvDisableSHM: "1"}, shm: true},
		{vars: map[string]string{EnvDisableSHM: "0"}},
		{vars: map[string]string{EnvDisableSHM: "1", EnvDisableRDMA: "1"}, rdma: true, shm: true},
		{vars: map[string]string{EnvDisableSHM: "no way"}, err: `invalid Config: environment RSOCK_DISABLE_SHM="no way", want 1 or true to disable shared memory, 0 or false not to`},
	}
	for _, tt := range tests {
		got := readEnv(func(name string) (string, bool) { v, ok := tt.vars[name]; return v, ok })
		require.Equal(t, tt.rdma, got.disableRDMA, "disableRDMA with %v", tt.vars)
		require.Equal(t, tt.shm, got.disableSHM, "disableSHM with %v", tt.vars)
		if tt.err == "" {
			require.NoError(t, got.err)
		} else {
			require.EqualError(t, got.err, tt.err)
		}
	}
}

// TestEnvDisablesSHM: with RSOCK_DISABLE_SHM=1, two processes' worth of default Configs
// on one host do not take shared memory.
func TestEnvDisablesSHM(t *testing.T) {
	withEnv(t, map[string]string{EnvDisableSHM: "1"})
	ln := listen(t, nil)
	c, s := pipe(t, ln, nil)
	defer c.Close()
	defer s.Close()
	exchangeSizes(t, c, s, 10, 1)
	require.NotEqual(t, TransportSHM, c.Transport(), "client, reason %v", c.FallbackReason())
	require.NotEqual(t, TransportSHM, s.Transport(), "server, reason %v", s.FallbackReason())
}

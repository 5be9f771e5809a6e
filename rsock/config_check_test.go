package rsock

import (
	"crypto/tls"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// configCases lists, for every field of Config, values Listen and Dial must refuse
// (bad, each with the text its error must contain: the field and the allowed range) and
// values at the edges of the range they must accept (good). A field whose every value
// means something has neither, and says why in free.
var configCases = []struct {
	field string
	bad   []badConfig
	good  []func(*Config)
	free  string
}{
	{field: "Provider", free: "nil selects the default"},
	{field: "DisableRDMA", free: "a boolean"},
	{field: "DisableSHM", free: "a boolean"},
	{field: "Fallback",
		bad:  []badConfig{{func(c *Config) { c.Fallback = 7 }, "Fallback is Fallback(7), want FallbackTCP or FallbackQUIC"}},
		good: []func(*Config){func(c *Config) { c.Fallback = FallbackTCP }}},
	{field: "TLSConfig",
		bad:  []badConfig{{func(c *Config) { c.Fallback = FallbackQUIC }, "TLSConfig is nil, want a *tls.Config with FallbackQUIC"}},
		good: []func(*Config){func(c *Config) { c.Fallback, c.TLSConfig = FallbackQUIC, &tls.Config{} }}},
	{field: "AllowPlaintextRDMA", free: "a boolean"},
	{field: "NoDirectPlacement", free: "a boolean"},
	{field: "QUICConfig", free: "nil means quic-go's defaults"},
	{field: "HandshakeTimeout",
		bad:  []badConfig{{func(c *Config) { c.HandshakeTimeout = -1 }, "HandshakeTimeout is -1ns, want 0 or more (0: the default, 10s)"}},
		good: []func(*Config){func(c *Config) { c.HandshakeTimeout = 1 }}},
	{field: "MaxConcurrentHandshakes",
		bad:  []badConfig{{func(c *Config) { c.MaxConcurrentHandshakes = -1 }, "MaxConcurrentHandshakes is -1, want 0 or more (0: the default, 128)"}},
		good: []func(*Config){func(c *Config) { c.MaxConcurrentHandshakes = 1 }}},
	{field: "KeepAlive", free: "negative disables it"},
	{field: "AcceptPlainClients", free: "a boolean"},
	{field: "PlainSniffTimeout",
		bad:  []badConfig{{func(c *Config) { c.PlainSniffTimeout = -1 }, "PlainSniffTimeout is -1ns, want 0 or more (0: the default, 200ms)"}},
		good: []func(*Config){func(c *Config) { c.PlainSniffTimeout = 1 }}},
	{field: "Logger", free: "nil has a meaning (see Config.Logger)"},
	{field: "Tracer", free: "nil means no events; any ConnTracer is valid"},
	{field: "RingSize",
		bad: []badConfig{
			{func(c *Config) { c.RingSize = 5000 }, "RingSize is 5000, want a power of two from 4096 (4 KiB) to 1073741824 (1 GiB)"},
			{func(c *Config) { c.RingSize = 2 << 10 }, "RingSize is 2048, want a power of two"},
			{func(c *Config) { c.RingSize = 2 << 30 }, "RingSize is 2147483648, want a power of two"},
			{func(c *Config) { c.RingSize = -4096 }, "RingSize is -4096, want a power of two"},
		},
		good: []func(*Config){
			func(c *Config) { c.RingSize = 4 << 10 },
			func(c *Config) { c.RingSize, c.GrowRingTo = 1<<30, -1 },
		}},
	{field: "GrowRingTo",
		bad: []badConfig{
			{func(c *Config) { c.RingSize, c.GrowRingTo = 8<<10, 2<<30 }, "GrowRingTo is 2147483648, want a power of two from RingSize (8192) to 1073741824 (1 GiB)"},
			{func(c *Config) { c.RingSize, c.GrowRingTo = 64<<10, 32<<10 }, "GrowRingTo is 32768, want a power of two from RingSize (65536)"},
			{func(c *Config) { c.GrowRingTo = 4 << 10 }, "GrowRingTo is 4096, want a power of two from RingSize (8192)"},
			{func(c *Config) { c.RingSize, c.GrowRingTo = 8<<10, 100<<10 }, "GrowRingTo is 102400"},
		},
		good: []func(*Config){
			func(c *Config) { c.GrowRingTo = 512 << 10 },
			func(c *Config) { c.GrowRingTo = 64 << 20 },
			func(c *Config) { c.GrowRingTo = -1 },
		}},
	{field: "SendBufferSize",
		bad: []badConfig{
			{func(c *Config) { c.SendBufferSize = 7 }, "SendBufferSize is 7, want 1024 (1 KiB) to 1073741824 (1 GiB), or 0 for the default (half of GrowRingTo up to 256 KiB, or 65536 for a fixed ring)"},
			{func(c *Config) { c.SendBufferSize = -1 }, "SendBufferSize is -1, want 1024"},
			{func(c *Config) { c.SendBufferSize = 1<<30 + 1 }, "SendBufferSize is 1073741825, want 1024"},
		},
		good: []func(*Config){
			func(c *Config) { c.SendBufferSize = 1 << 10 },
			func(c *Config) { c.SendBufferSize = 1 << 30 },
		}},
	{field: "RecvWQEs",
		bad: []badConfig{
			{func(c *Config) { c.RecvWQEs = 1 << 20 }, "RecvWQEs is 1048576, want 8 to 32768, or 0 for the default, 64 growing to 128"},
			{func(c *Config) { c.RecvWQEs = -5 }, "RecvWQEs is -5, want 8 to 32768"},
			{func(c *Config) { c.RecvWQEs = 7 }, "RecvWQEs is 7, want 8 to 32768"},
		},
		good: []func(*Config){
			func(c *Config) { c.RecvWQEs = 8 },
			func(c *Config) { c.RecvWQEs = 1 << 15 },
		}},
	{field: "MaxRDMAConns", free: "zero or negative: no cap"},
	{field: "MaxRDMAConnsPerRemote", free: "negative: no limit"},
	{field: "MaxRDMAConnsPerListener", free: "negative: no limit"},
	{field: "MaxRegisteredMemoryPerRemote", free: "negative: no limit"},
	{field: "MaxRegisteredMemoryPerListener", free: "negative: no limit"},
	{field: "PollSpin", free: "negative never spins"},
	{field: "ReadBufferSize",
		bad:  []badConfig{{func(c *Config) { c.ReadBufferSize = 2 << 30 }, "ReadBufferSize is 2147483648, want at most 1073741824 (1 GiB)"}},
		good: []func(*Config){func(c *Config) { c.ReadBufferSize = 1 << 30 }, func(c *Config) { c.ReadBufferSize = -1 }}},
	{field: "Linger", free: "negative: Close does not wait"},
	{field: "MaxRegisteredMemory",
		bad:  []badConfig{{func(c *Config) { c.MaxRegisteredMemory = -1 }, "MaxRegisteredMemory is -1, want a positive cap in bytes, or 0 for none"}},
		good: []func(*Config){func(c *Config) { c.MaxRegisteredMemory = 1 }}},
	{field: "TrafficClass",
		bad: []badConfig{
			{func(c *Config) { c.TrafficClass = 256 }, "TrafficClass is 256, want 0 to 255 (DSCP<<2 | ECN)"},
			{func(c *Config) { c.TrafficClass = -1 }, "TrafficClass is -1, want 0 to 255"},
		},
		good: []func(*Config){func(c *Config) { c.TrafficClass = 255 }}},
	{field: "ServiceLevel",
		bad: []badConfig{
			{func(c *Config) { c.ServiceLevel = 16 }, "ServiceLevel is 16, want 0 to 15"},
			{func(c *Config) { c.ServiceLevel = -1 }, "ServiceLevel is -1, want 0 to 15"},
		},
		good: []func(*Config){func(c *Config) { c.ServiceLevel = 15 }}},
	{field: "RoCEVersion",
		bad: []badConfig{
			{func(c *Config) { c.RoCEVersion = 3 }, "RoCEVersion is 3, want 1 or 2, or 0 for no preference"},
			{func(c *Config) { c.RoCEVersion = -1 }, "RoCEVersion is -1, want 1 or 2"},
		},
		good: []func(*Config){func(c *Config) { c.RoCEVersion = 2 }}},
}

type badConfig struct {
	set  func(*Config)
	text string
}

// TestConfigCasesCoverEveryField fails when Config gains a field that configCases does
// not decide about: each new field is checked, or says why every value is valid.
func TestConfigCasesCoverEveryField(t *testing.T) {
	listed := make(map[string]bool)
	for _, tc := range configCases {
		require.False(t, listed[tc.field], "%s listed twice", tc.field)
		listed[tc.field] = true
		require.True(t, (len(tc.bad) > 0) != (tc.free != ""), "%s: give bad values or say why every value is valid", tc.field)
	}
	for f := range reflect.TypeFor[Config]().Fields() {
		require.True(t, listed[f.Name], "Config.%s has no entry in configCases", f.Name)
	}
}

// TestConfigValidation feeds Listen and Dial each out-of-range value: both refuse it
// before touching the network, with an error matching ErrInvalidConfig that names the
// field, the value and the range. The values at the edges of each range are accepted.
func TestConfigValidation(t *testing.T) {
	for _, tc := range configCases {
		for _, b := range tc.bad {
			cfg := &Config{}
			b.set(cfg)
			_, err := Listen("tcp", "127.0.0.1:0", cfg)
			require.ErrorIs(t, err, ErrInvalidConfig, "Listen with a bad %s", tc.field)
			require.ErrorContains(t, err, "rsock: listen 127.0.0.1:0: invalid Config: "+b.text, "Listen with a bad %s", tc.field)
			// Port 1 on loopback: a dial that got past the checks would be refused, with
			// another error.
			_, err = Dial("tcp", "127.0.0.1:1", cfg)
			require.ErrorIs(t, err, ErrInvalidConfig, "Dial with a bad %s", tc.field)
			require.ErrorContains(t, err, "rsock: dial 127.0.0.1:1: invalid Config: "+b.text, "Dial with a bad %s", tc.field)
			require.True(t, strings.Contains(err.Error(), tc.field), "%q names %s", err, tc.field)
		}
		for i, set := range tc.good {
			cfg := &Config{}
			set(cfg)
			_, err := cfg.resolve()
			require.NoError(t, err, "%s, accepted value %d", tc.field, i)
		}
	}
}

// TestConfigNetworkErrors: a network other than TCP's is refused by name.
func TestConfigNetworkErrors(t *testing.T) {
	for _, network := range []string{"udp", "unix", ""} {
		_, err := Listen(network, "127.0.0.1:0", nil)
		require.ErrorContains(t, err, "unknown network "+network, "Listen on %q", network)
		_, err = Dial(network, "127.0.0.1:1", nil)
		require.ErrorContains(t, err, "unknown network "+network, "Dial on %q", network)
	}
}

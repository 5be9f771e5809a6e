package main

import (
	"encoding/json"
	"expvar"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the example's load and checks the counters it prints: each kind of
// client is counted under its transport and fallback reason, both ends of each
// connection (they live in one process), and the bad client as a failed handshake.
//
// The counters are the process's: the test checks what this run added to them.
func TestRun(t *testing.T) {
	var before map[string]map[string]int64
	require.NoError(t, json.Unmarshal([]byte(expvar.Get("rsock").String()), &before))
	var out strings.Builder
	require.NoError(t, run(t.Context(), "127.0.0.1:0", false, &out))
	t.Log("\n" + out.String())
	_, js, ok := strings.Cut(out.String(), "\n")
	require.True(t, ok, "output: %s", out.String())
	var vars map[string]map[string]int64
	require.NoError(t, json.Unmarshal([]byte(js), &vars), "output: %s", out.String())

	for group, m := range vars {
		for k := range m {
			m[k] -= before[group][k]
		}
	}
	nonzero := func(m map[string]int64) map[string]int64 {
		out := map[string]int64{}
		for k, v := range m {
			if v != 0 {
				out[k] = v
			}
		}
		return out
	}
	// Two connections of each kind, each counted at both ends where both are rsock's.
	require.Equal(t, map[string]int64{
		"rdma":     4, // rsock clients with RDMA
		"rdma+tls": 4, // rsock clients over QUIC with RDMA
		"quic":     4, // rsock clients over QUIC without RDMA
		// 4: the rsock clients with RDMA disabled; 5 plain clients, the server's end
		// only: 2 stock net/http, 2 raw net.Dial, and the one fetching /debug/vars.
		"tcp": 9,
	}, nonzero(vars["conns_opened"]))
	require.Equal(t, map[string]int64{
		"no_provider":       4, // the clients with RDMA disabled or no provider
		"peer_offered_none": 4, // the server, for those
		"plain_client":      5,
	}, nonzero(vars["fallbacks"]))
	require.Equal(t, map[string]int64{"bad_hello": 1}, nonzero(vars["handshake_failures"]))
	for _, tr := range []string{"rdma", "rdma+tls", "quic", "tcp"} {
		require.Positive(t, vars["bytes_read"][tr], "bytes read over %s", tr)
		require.Positive(t, vars["bytes_written"][tr], "bytes written over %s", tr)
	}
}

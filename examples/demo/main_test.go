package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the demo briefly on every transport and checks the table's shape and
// that each column ran on its transport (run fails otherwise).
func TestRun(t *testing.T) {
	var out strings.Builder
	o := options{duration: 50 * time.Millisecond, clients: 2, transports: []string{"rdma", "tcp", "quic"}}
	require.NoError(t, run(t.Context(), o, &out))
	got := out.String()
	t.Log("\n" + got)
	lines := strings.Split(got, "\n")
	row := func(prefix string) []string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return strings.Fields(strings.TrimPrefix(l, prefix))
			}
		}
		t.Fatalf("no row %q in:\n%s", prefix, got)
		return nil
	}
	require.Equal(t, []string{"rdma/rdma", "tcp/tcp", "quic/quic"}, row("transport (client/server)"))
	for _, r := range []string{"HTTP GET requests/s", "gRPC unary calls/s", "bulk transfer MB/s"} {
		cells := row(r)
		require.Len(t, cells, 3, r)
		for _, c := range cells {
			require.NotEqual(t, "0", c, "%s: a column measured nothing:\n%s", r, got)
		}
	}
	require.Contains(t, got, "soft RDMA is rsock's software RDMA provider")
}

func TestUnknownTransport(t *testing.T) {
	err := run(t.Context(), options{duration: time.Millisecond, clients: 1, transports: []string{"carrier-pigeon"}}, new(strings.Builder))
	require.ErrorContains(t, err, `unknown transport "carrier-pigeon"`)
}

func TestThousands(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{0, "0"}, {999.4, "999"}, {1000, "1,000"}, {123456.7, "123,457"}, {1234567, "1,234,567"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, thousands(tt.in), "thousands(%v)", tt.in)
	}
}

//go:build rdma && linux && cgo

package ibv

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/internal/vma"
	"github.com/rsockio/rsock/verbs"
)

// TestMappingsCounted checks, on the device the tests run on (rxe in the CI's VM), that
// regions, QPs and CQs count at least the memory mappings they make: /proc/self/maps
// grows by no more than the count over n of each, give or take what the Go runtime maps
// meanwhile, and the count returns to where it was once they are closed. It is skipped
// where there is no device.
func TestMappingsCounted(t *testing.T) {
	p, err := Open()
	if err != nil {
		t.Skipf("ibv: no RDMA device on this machine: %v", err)
	}
	devs, err := p.Devices()
	if err != nil || len(devs) == 0 {
		t.Skipf("ibv: no RDMA device on this machine: %v", err)
	}
	ctx, err := p.Open(devs[0].Name)
	require.NoError(t, err)
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer pd.Close()

	const n = 16
	// runtimeSlack is what the Go runtime and the C allocator may map while n of each
	// are made: heap arenas, a thread's stack.
	const runtimeSlack = 8
	start := vma.Held()
	for _, c := range []struct {
		name   string
		charge int
		make   func() (interface{ Close() error }, error)
	}{
		{"MR", mrMappings, func() (interface{ Close() error }, error) {
			return pd.RegMR(64<<10, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		}},
		{"CQ", cqMappings, func() (interface{ Close() error }, error) {
			return ctx.CreateCQ(256, nil, 0)
		}},
		{"QP", qpMappings, func() (interface{ Close() error }, error) {
			cq, err := ctx.CreateCQ(256, nil, 0)
			if err != nil {
				return nil, err
			}
			qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
				Caps: verbs.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
			if err != nil {
				cq.Close()
				return nil, err
			}
			return closers{qp, cq}, nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			charge := c.charge
			if c.name == "QP" {
				charge += cqMappings // each QP here has a CQ of its own
			}
			before, counted := mappings(t), vma.Held()
			var made []interface{ Close() error }
			for range n {
				o, err := c.make()
				require.NoError(t, err)
				made = append(made, o)
			}
			grew := mappings(t) - before
			require.Equal(t, int64(n*charge), vma.Held()-counted, "counted")
			require.LessOrEqual(t, grew, n*charge+runtimeSlack,
				"%d %ss made %d mappings; counted %d each", n, c.name, grew, charge)
			t.Logf("%d %ss: %d mappings, %d counted", n, c.name, grew, n*charge)
			for _, o := range made {
				require.NoError(t, o.Close())
			}
			require.Equal(t, counted, vma.Held(), "given back on Close")
		})
	}
	require.Equal(t, start, vma.Held())
}

// closers closes each in turn.
type closers []interface{ Close() error }

func (cs closers) Close() error {
	for _, c := range cs {
		if err := c.Close(); err != nil {
			return err
		}
	}
	return nil
}

// mappings counts this process's memory mappings.
func mappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return bytes.Count(b, []byte("\n"))
}

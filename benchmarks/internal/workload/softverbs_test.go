package workload

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSoftVerbsWorkloads runs the raw soft-verbs stream and ping-pong, with and without
// a socket's copies, at sizes up to 1 MiB: each must complete its operations without a
// failed completion (a ping-pong whose ring was smaller than its message once ended in
// a flushed receive).
func TestSoftVerbsWorkloads(t *testing.T) {
	for _, name := range []string{SoftVerbs, SoftVerbs3Copy} {
		tr, ok := Lookup(name)
		require.True(t, ok, name)
		for _, w := range []struct {
			name string
			run  func(Control, *Env, Params) (Metrics, error)
		}{{Stream, runStream}, {PingPong, runPingPong}} {
			for _, size := range []int{64, 64 << 10, 1 << 20} {
				t.Run(fmt.Sprintf("%s/%s/%s", name, w.name, SizeName(size)), func(t *testing.T) {
					env, err := Start(tr, Options{})
					require.NoError(t, err)
					defer env.Close()
					const ops = 40
					ctl := &Timed{Duration: time.Hour, MaxOps: ops}
					m, err := w.run(ctl, env, Params{Size: size, Conns: 1})
					require.NoError(t, err)
					require.Equal(t, int64(ops), ctl.Ops())
					require.Positive(t, m.BytesPerOp)
				})
			}
		}
	}
}

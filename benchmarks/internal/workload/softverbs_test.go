package workload

import (
	"fmt"
	"testing"
	"time"

	"github.com/rsockio/rsock/verbs"
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

// startCopying starts SoftVerbs3Copy's environment, closed when t ends.
func startCopying(t *testing.T) *Env {
	t.Helper()
	tr, ok := Lookup(SoftVerbs3Copy)
	require.True(t, ok)
	env, err := Start(tr, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { env.Close() })
	return env
}

// TestSoftPingPongEchoFails checks that SoftVerbs3Copy's ping-pong ends with the echo's
// error, rather than waiting for an answer forever, when the echo cannot answer.
func TestSoftPingPongEchoFails(t *testing.T) {
	env := startCopying(t)
	for _, c := range []struct {
		name   string
		broken func(x, y *SoftEndpoint) verbs.MR
		want   error // besides the echo's failure
	}{
		// The pinging side's ring is gone: the first answer fails with a remote access
		// error, which puts both QPs in error, and each party's receive is flushed.
		{"ping's ring", func(x, y *SoftEndpoint) verbs.MR { return x.Ring }, nil},
		// The echo's source region is gone: its first answer fails locally, its QP
		// alone goes to error, and the pinging party, whose QP is well, is stopped.
		{"echo's source", func(x, y *SoftEndpoint) verbs.MR { return y.Src }, errSoftStopped},
	} {
		t.Run(c.name, func(t *testing.T) {
			const size = 4 << 10 // not inline: the source region is read
			x, y, closePair, err := NewSoftPair(env.fabric, size, 1<<16)
			require.NoError(t, err)
			defer closePair() // closes the broken region a second time: not this test's error
			require.NoError(t, c.broken(x, y).Close())

			_, err = softPingPongEcho(&Timed{Duration: time.Hour, MaxOps: 10}, x, y, size)
			require.ErrorContains(t, err, "echo: ")
			if c.want != nil {
				require.ErrorIs(t, err, c.want)
			}
		})
	}
}

// TestSoftStreamCopyingFails checks that SoftVerbs3Copy's stream ends with an error,
// rather than waiting for credit forever, when it cannot go on: when the first write
// fails (the reader's ring is gone: a remote access error, which puts both QPs in
// error), and when the reader fails while the writer waits for credit (the reader's QP
// moved to ERROR, which flushes its receives, before the writer's first signaled send).
func TestSoftStreamCopyingFails(t *testing.T) {
	env := startCopying(t)
	for _, c := range []struct {
		name   string
		size   int // the ring holds 64 KiB of them
		broken func(x, y *SoftEndpoint) error
		want   []string
	}{
		{"reader's ring", 4 << 10, func(x, y *SoftEndpoint) error { return y.Ring.Close() },
			[]string{"remote access error"}},
		{"reader's QP", 16 << 10, func(x, y *SoftEndpoint) error { return y.QP.ToError() },
			[]string{"reader: ", errSoftStopped.Error()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, y, closePair, err := NewSoftPair(env.fabric, c.size, 64<<10)
			require.NoError(t, err)
			defer closePair() // may close a broken region a second time: not this test's error
			require.NoError(t, c.broken(x, y))

			_, err = softStreamCopying(&Timed{Duration: time.Hour, MaxOps: 1000}, x, y, c.size)
			for _, w := range c.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

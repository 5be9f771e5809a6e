package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/shm"
	"github.com/rsockio/rsock/verbs/soft"
)

// yieldingCQ is a fake CQ whose polls say they yield the processor, or not.
type yieldingCQ struct {
	*fakeCQ
	yields bool
}

func (c yieldingCQ) PollYields() bool { return c.yields }

// TestCQYields: the engine skips its own Gosched only on CQs that say their empty
// polls yield the processor now: verbs/shm's can (it has PollYields); soft's, and a
// CQ without the method or whose method says false, do not.
func TestCQYields(t *testing.T) {
	p, err := shm.New(shm.Options{})
	require.NoError(t, err)
	defer p.Close()
	ctx, err := p.Open("shm0")
	require.NoError(t, err)
	defer ctx.Close()
	shmCQ, err := ctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	defer shmCQ.Close()
	f := soft.New(soft.Options{})
	devs, err := f.Devices()
	require.NoError(t, err)
	sctx, err := f.Open(devs[0].Name)
	require.NoError(t, err)
	defer sctx.Close()
	softCQ, err := sctx.CreateCQ(16, nil, 0)
	require.NoError(t, err)
	defer softCQ.Close()

	for _, tc := range []struct {
		name       string
		cq         completionQueue
		hasYielder bool
		want       bool
		provider   bool
	}{
		{name: "shm", cq: shmCQ, hasYielder: true, provider: true},
		{name: "soft", cq: softCQ},
		{name: "no PollYields", cq: newFakeCQ()},
		{name: "PollYields false", cq: yieldingCQ{newFakeCQ(), false}, hasYielder: true},
		{name: "PollYields true", cq: yieldingCQ{newFakeCQ(), true}, hasYielder: true, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &poller{cq: tc.cq, yielder: cqYielder(tc.cq)}
			require.Equal(t, tc.hasYielder, p.yielder != nil)
			if tc.provider { // shm's answer depends on the host's load: it is its own
				require.Equal(t, tc.cq.(pollYielder).PollYields(), p.yields())
				return
			}
			require.Equal(t, tc.want, p.yields())
		})
	}
}

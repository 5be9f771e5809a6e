package workload

import (
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTimed(t *testing.T) {
	ctl := &Timed{Duration: time.Minute, MaxOps: 1000}
	n := 0
	for ctl.Next() {
		n++
	}
	require.Equal(t, 1000, n)
	require.Equal(t, int64(1000), ctl.Ops())
	require.False(t, ctl.Next(), "Next after the end")

	// A timed run, on synctest's clock: each operation takes 10 µs of it.
	synctest.Test(t, func(t *testing.T) {
		var progress []float64
		ctl := &Timed{Duration: 30 * time.Millisecond, Progress: func(f float64) { progress = append(progress, f) }}
		for ctl.Next() {
			time.Sleep(10 * time.Microsecond)
		}
		require.GreaterOrEqual(t, ctl.Elapsed(), 30*time.Millisecond)
		require.Positive(t, ctl.Ops())
		for _, f := range progress {
			require.True(t, f >= 0 && f <= 1.2, "progress %g", f)
		}
	})
}

func TestPercentiles(t *testing.T) {
	r := newRecorder()
	require.Nil(t, r.percentiles(), "no samples")
	for i := 1000; i >= 1; i-- {
		r.add(time.Duration(i))
	}
	p := r.percentiles()
	want := Percentiles{N: 1000, P50: 500, P99: 990, P999: 999}
	require.Equal(t, want, *p, "percentiles of 1..1000 ns")
}

func TestFanOut(t *testing.T) {
	var ran atomic.Int64
	ctl := &Timed{Duration: time.Minute, MaxOps: 500}
	require.NoError(t, fanOut(ctl, 4, func(int) error { ran.Add(1); return nil }))
	require.Equal(t, int64(500), ran.Load())

	boom := errors.New("boom")
	ctl = &Timed{Duration: time.Minute, MaxOps: 500}
	err := fanOut(ctl, 4, func(w int) error {
		if w == 2 {
			return boom
		}
		return nil
	})
	require.ErrorIs(t, err, boom)
}

func TestPipeHalfClose(t *testing.T) {
	x, y := halfClosablePipe()
	defer x.Close()
	defer y.Close()
	go func() {
		x.Write([]byte("hello"))
		x.CloseWrite()
	}()
	b, err := io.ReadAll(y)
	require.NoError(t, err)
	require.Equal(t, "hello", string(b))
	go y.Write([]byte("back"))
	buf := make([]byte, 4)
	_, err = io.ReadFull(x, buf)
	require.NoError(t, err, "x reads after its CloseWrite")
	require.Equal(t, "back", string(buf))
}

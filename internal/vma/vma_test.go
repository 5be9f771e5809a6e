package vma

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/rsockio/rsock/verbs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestReserve(t *testing.T) {
	defer SetBudget(Held() + 10)()
	start := Held()

	require.NoError(t, Reserve(4))
	require.NoError(t, Reserve(6))
	require.Equal(t, start+10, Held())

	err := Reserve(1)
	require.ErrorIs(t, err, verbs.ErrNoResources)
	var le *LimitError
	require.True(t, errors.As(err, &le))
	require.Equal(t, LimitError{Held: start + 10, Want: 1, Budget: start + 10}, *le)
	require.Contains(t, err.Error(), "vm.max_map_count")
	require.Equal(t, start+10, Held(), "a refused Reserve counts nothing")

	Release(3)
	require.NoError(t, Reserve(3), "what was given back may be taken again")
	require.Error(t, Reserve(1))
	Release(10)
	require.Equal(t, start, Held())
}

// TestReserveConcurrent checks that Reserves racing for the last of the budget never
// take more than it, whoever wins.
func TestReserveConcurrent(t *testing.T) {
	const budget, goroutines, each = 100, 8, 40
	defer SetBudget(Held() + budget)()
	start := Held()
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := 0
	for range goroutines {
		wg.Go(func() {
			for range each {
				if Reserve(1) == nil {
					mu.Lock()
					got++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, budget, got)
	require.Equal(t, start+budget, Held())
	Release(budget)
}

func TestReadMaxMapCount(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, content string
		want          int64
	}{
		{"set", "262144\n", 262144},
		{"low", "2500", 2500},
		{"garbage", "many\n", defaultMaxMapCount},
		{"zero", "0\n", defaultMaxMapCount},
		{"negative", "-7\n", defaultMaxMapCount},
		{"missing", "", defaultMaxMapCount},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(dir, c.name)
			if c.name != "missing" {
				require.NoError(t, os.WriteFile(file, []byte(c.content), 0o600))
			}
			require.Equal(t, c.want, readMaxMapCount(file))
		})
	}
}

// TestBudgetIsHalfTheLimit checks the budget against this machine's own limit.
func TestBudgetIsHalfTheLimit(t *testing.T) {
	want := readMaxMapCount(maxMapCountFile) / 2
	defer setLimit(0, false)() // read afresh, then restored
	require.Equal(t, want, Budget())
}

// TestReserveRereadsTheLimit: a Reserve about to refuse reads vm.max_map_count again,
// so that raising it takes effect without a restart.
func TestReserveRereadsTheLimit(t *testing.T) {
	file := filepath.Join(t.TempDir(), "max_map_count")
	writeLimit := func(n int64) {
		require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf("%d\n", n)), 0o600))
	}
	base := Held()
	writeLimit(2 * (base + 4))
	loadMu.Lock()
	oldFile := limitFile
	limitFile = file
	loadMu.Unlock()
	defer func() {
		loadMu.Lock()
		limitFile = oldFile
		loadMu.Unlock()
	}()
	defer setLimit(0, false)() // read from the file, then restored

	require.NoError(t, Reserve(4))
	require.Error(t, Reserve(1), "at the limit read")
	writeLimit(2 * (base + 6))
	require.NoError(t, Reserve(2), "the limit was raised")
	require.Error(t, Reserve(1))
	Release(6)
	require.Equal(t, base, Held())
}

package rc

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

func TestKeyTableLookup(t *testing.T) {
	a := &Region{Buf: make([]byte, 16), Addr: 0x1000}
	b := &Region{Buf: make([]byte, 16), Addr: 0x2000}
	var k KeyTable
	ka, err := k.Insert(a)
	require.NoError(t, err)
	kb, err := k.Insert(b)
	require.NoError(t, err)
	require.NotEqual(t, ka, kb, "two live regions share a key")
	require.Equal(t, ka, a.Key(), "Key of the first region")
	require.Equal(t, kb, b.Key(), "Key of the second region")
	tests := []struct {
		name string
		key  uint32
		want *Region
	}{
		{"first", ka, a},
		{"second", kb, b},
		{"zero", 0, nil},
		{"index 0, generation 1", 1, nil},
		{"other generation", ka + 1, nil},
		{"unused index", key(3), nil},
		{"index past the last chunk", (MaxKeyIndexes + 1 + ka>>keyGenBits) << keyGenBits, nil},
		{"largest key", ^uint32(0), nil},
	}
	for _, tt := range tests {
		require.Same(t, tt.want, k.Lookup(tt.key), "%s: Lookup(%#x)", tt.name, tt.key)
	}
}

// TestKeyTableReuse removes and inserts a region on one index over and over: the zero
// table reuses the index and comes back to its first key after 256 generations; a
// NeverReuse table retires the index when its generations are spent and moves on.
func TestKeyTableReuse(t *testing.T) {
	tests := []struct {
		name       string
		neverReuse bool
	}{
		{"reuse", false},
		{"never reuse", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var k KeyTable
			if tt.neverReuse {
				k.NeverReuse()
			}
			seen := map[uint32]int{}
			const rounds = 1<<keyGenBits + 1
			for i := range rounds {
				r := new(Region)
				key, err := k.Insert(r)
				require.NoError(t, err, "Insert %d", i)
				require.Same(t, r, k.Lookup(key), "Lookup of live key %#x", key)
				if j, ok := seen[key]; ok {
					require.False(t, tt.neverReuse, "key %#x of insert %d given again at insert %d", key, j, i)
				}
				seen[key] = i
				k.Remove(key)
				require.Nil(t, k.Lookup(key), "Lookup of removed key %#x", key)
			}
			if !tt.neverReuse {
				require.Len(t, seen, 1<<keyGenBits, "distinct keys of one index")
			}
		})
	}
}

// TestKeyTableInsertLocal checks InsertLocal on a NeverReuse table: a region
// registered and deregistered over and over reuses one index, its keys wrapping,
// rather than retiring an index every 256 times; and no index of InsertLocal's is
// given to Insert, whose keys a peer may hold, nor one of Insert's to InsertLocal.
func TestKeyTableInsertLocal(t *testing.T) {
	var k KeyTable
	k.NeverReuse()
	shared := new(Region)
	sharedKey, err := k.Insert(shared)
	require.NoError(t, err)
	k.Remove(sharedKey) // its index is free for Insert only

	localIdx := map[uint32]bool{}
	const rounds = 3<<keyGenBits + 1
	for i := range rounds {
		r := new(Region)
		key, err := k.InsertLocal(r)
		require.NoError(t, err, "InsertLocal %d", i)
		require.Same(t, r, k.Lookup(key))
		require.NotEqual(t, sharedKey>>keyGenBits, key>>keyGenBits, "InsertLocal took Insert's index")
		localIdx[key>>keyGenBits] = true
		k.Remove(key)
		require.Nil(t, k.Lookup(key))
	}
	require.Len(t, localIdx, 1, "indexes used by %d local registrations in turn", rounds)
	require.Equal(t, uint32(3), k.next, "indexes ever used: Insert's and InsertLocal's")

	again, err := k.Insert(new(Region))
	require.NoError(t, err)
	require.Equal(t, sharedKey>>keyGenBits, again>>keyGenBits, "Insert reuses its own freed index")
	require.NotEqual(t, sharedKey, again, "under the next generation")
	require.False(t, localIdx[again>>keyGenBits], "Insert took InsertLocal's index")
}

func TestKeyTableRemove(t *testing.T) {
	var k KeyTable
	a := new(Region)
	ka, err := k.Insert(a)
	require.NoError(t, err)
	k.Remove(ka + 1) // a stale or forged key of a's index leaves a in place
	k.Remove(0)
	k.Remove(^uint32(0))
	require.Same(t, a, k.Lookup(ka), "Lookup after removing other keys")
	k.Remove(ka)
	k.Remove(ka) // twice frees the index once
	b, c := new(Region), new(Region)
	kb, err := k.Insert(b)
	require.NoError(t, err)
	kc, err := k.Insert(c)
	require.NoError(t, err)
	require.NotEqual(t, kb>>keyGenBits, kc>>keyGenBits, "two live regions on one index")
}

func TestKeyTableFull(t *testing.T) {
	var k KeyTable
	_, err := k.Insert(new(Region))
	require.NoError(t, err)
	k.next = MaxKeyIndexes // as if every index but the last were live
	k.gen = make([]uint8, MaxKeyIndexes)
	k.local = make([]bool, MaxKeyIndexes)
	last := new(Region)
	key, err := k.Insert(last)
	require.NoError(t, err, "Insert into the last index")
	require.Same(t, last, k.Lookup(key), "Lookup in the last index")
	_, err = k.Insert(new(Region))
	require.True(t, errors.Is(err, verbs.ErrNoResources), "Insert into a full table: %v", err)
}

func TestKeyTableByAddr(t *testing.T) {
	var k KeyTable
	a := &Region{Buf: make([]byte, 16), Addr: 0x1000}
	b := &Region{Buf: make([]byte, 100), Addr: 0x2000}
	for _, r := range []*Region{a, b} {
		_, err := k.Insert(r)
		require.NoError(t, err)
	}
	tests := []struct {
		addr uint64
		n    uint32
		want *Region
	}{
		{0x1000, 16, a},
		{0x2000 + 10, 20, b},
		{0x2000 + 90, 20, nil}, // across b's end
		{0x3000, 1, nil},
	}
	for _, tt := range tests {
		r, got := k.ByAddr(tt.addr, tt.n)
		require.Same(t, tt.want, r, "ByAddr(%#x, %d)", tt.addr, tt.n)
		if r != nil {
			require.Len(t, got, int(tt.n), "bytes of ByAddr(%#x, %d)", tt.addr, tt.n)
		}
	}
	k.Remove(b.Key())
	r, _ := k.ByAddr(0x2000, 1)
	require.Nil(t, r, "ByAddr in a removed region")
}

// TestKeyTableConcurrent looks keys up while other goroutines insert and remove regions;
// run with -race, it checks that lookups need no lock.
func TestKeyTableConcurrent(t *testing.T) {
	var k KeyTable
	stable := new(Region)
	key, err := k.Insert(stable)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 200 {
				r := new(Region)
				key, err := k.Insert(r)
				if err != nil {
					t.Error(err)
					return
				}
				if got := k.Lookup(key); got != r {
					t.Errorf("Lookup(%#x) = %p, want %p", key, got, r)
				}
				k.Remove(key)
			}
		})
	}
	wg.Go(func() {
		for range 1000 {
			if got := k.Lookup(key); got != stable {
				t.Errorf("Lookup(%#x) = %p, want %p", key, got, stable)
			}
		}
	})
	wg.Wait()
}

func TestKeyTableLookupAllocs(t *testing.T) {
	var k KeyTable
	key, err := k.Insert(new(Region))
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() { k.Lookup(key) })
	require.Zero(t, allocs, "allocations per Lookup")
}

// TestKeyTableGrows fills more than one chunk: regions in every chunk stay found.
func TestKeyTableGrows(t *testing.T) {
	var k KeyTable
	rs := make([]Region, 3*keyChunkSize)
	keys := make([]uint32, len(rs))
	for i := range rs {
		var err error
		keys[i], err = k.Insert(&rs[i])
		require.NoError(t, err, "Insert %d", i)
	}
	for i, key := range keys {
		require.Same(t, &rs[i], k.Lookup(key), "Lookup(%#x) of region %d", key, i)
	}
}

package rsock

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sysctlTestEnv allows a test to change a sysctl for the whole machine: set where
// nothing else runs meanwhile (the CI's VM), since a vm.max_map_count lowered under
// other processes could kill them.
const sysctlTestEnv = "RSOCK_TEST_SYSCTL"

const maxMapCountFile = "/proc/sys/vm/max_map_count"

// mapCountHeadroom is how far above the parent's own mappings TestMaxMapCount sets
// vm.max_map_count for its child: rsock's share, half of it, holds some tens of
// connections; the rest is the child's own (the same binary as the parent) and its
// runtime's growth.
const mapCountHeadroom = 1500

// TestMaxMapCount opens connections in a child process with vm.max_map_count lowered,
// many more than rsock's share of it (internal/vma: half) holds, keeping them all open
// and the heap growing between them. Each connection maps memory (about ten
// mappings on shared memory, both ends in this process), and once the limit is
// reached the Go runtime's next mmap is refused and the process dies ("fatal error:
// runtime: cannot allocate memory"); a program that made as many TCP connections
// would have run on. So rsock stops at its share: the child lives, every connection
// carries bytes, and those past the share are on TCP with a reason that names
// vm.max_map_count. It runs on shared memory, and on the default provider (rdma-core in
// the CI's VM) where there is one.
//
// vm.max_map_count is the machine's, not the process's: the test changes it only with
// RSOCK_TEST_SYSCTL=1, as root, and puts it back when the child ends. Elsewhere it is
// skipped; TestSHMMappingLimit covers the same ground with rsock's share lowered in
// process.
func TestMaxMapCount(t *testing.T) {
	if os.Getenv(childEnv) == t.Name() {
		mapCountChild(t)
		return
	}
	if os.Getenv(sysctlTestEnv) != "1" || os.Geteuid() != 0 {
		t.Skipf("changes vm.max_map_count for the whole machine: run as root with %s=1 where nothing else runs (the CI's VM does)", sysctlTestEnv)
	}
	orig, err := os.ReadFile(maxMapCountFile)
	require.NoError(t, err)
	limit := ownMappings(t) + mapCountHeadroom
	require.NoError(t, os.WriteFile(maxMapCountFile, []byte(strconv.Itoa(limit)), 0o644))
	defer func() { require.NoError(t, os.WriteFile(maxMapCountFile, orig, 0o644)) }()
	t.Logf("vm.max_map_count %d (was %s) while the child runs", limit, bytes.TrimSpace(orig))
	inChild(t)
}

// mapCountConns is how many connections the child opens per provider: several times
// what rsock's share holds at mapCountHeadroom.
const mapCountConns = 300

// mapCountChild is TestMaxMapCount in the child.
func mapCountChild(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  *Config
	}{
		{"shared memory", nil},
		{"default provider", &Config{DisableSHM: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.cfg != nil {
				if _, err := defaultProvider(); err != nil {
					t.Skipf("no default provider: %v", err)
				}
			}
			ln := listen(t, c.cfg)
			var conns []*Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			var heap [][]byte
			upgraded, fellBack := 0, 0
			var reason error
			for i := range mapCountConns {
				c, s := pipe(t, ln, c.cfg)
				conns = append(conns, c, s)
				requireEcho(t, c, s)
				heap = append(heap, make([]byte, 256<<10)) // the runtime maps as the heap grows
				if c.Transport() == TransportTCP {
					fellBack++
					reason = c.FallbackReason()
					if !strings.Contains(reason.Error(), "vm.max_map_count") {
						reason = s.FallbackReason()
					}
					require.ErrorContains(t, reason, "vm.max_map_count", "connection %d", i)
					continue
				}
				upgraded++
			}
			t.Logf("%d connections: %d on %s, then %d on TCP: %v; %d mappings, %d MiB of heap",
				mapCountConns, upgraded, conns[0].Transport(), fellBack, reason, ownMappings(t), len(heap)/4)
			require.Positive(t, upgraded)
			require.Positive(t, fellBack)
		})
	}
}

// ownMappings counts this process's memory mappings.
func ownMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return bytes.Count(b, []byte("\n"))
}

# mem.sh: registered memory against the kernel's limits (busybox sh, sourced by /init).
#
# mem_memlock: rsock's TestMemlockFallback over rdma-core on rxe. The test binary runs
# itself again as the user nobody (no CAP_IPC_LOCK) with RLIMIT_MEMLOCK at 128 KiB, the
# `ulimit -l 128` of a small container: connections fall back to TCP with a reason that
# names RLIMIT_MEMLOCK and the figures, both when rsock's own check stops them and when
# the kernel's ENOMEM does (memory pinned outside rsock), and the bytes still flow; at
# the defaults (rings that start at 8 KiB and grow) both ends fit under it and stream.
#
# mem_ring_growth: the engine's TestRingGrows over rdma-core on rxe: rings that start at
# 4 KiB grow to 64 KiB under a stream (flowctl's resize and switch, the new ring's
# description through the peer's mailbox), both ways at once, every byte checked, the
# replaced rings deregistered.
#
# mem_max_map_count: rsock's TestMaxMapCount, allowed to change a sysctl
# (RSOCK_TEST_SYSCTL=1: nothing else runs in the VM meanwhile). It lowers
# vm.max_map_count to some 1,500 above the process's own mappings and opens several
# times the connections rsock's share of it (half) holds, on shared memory and on
# rdma-core, keeping them open: the process must live (past the limit the Go
# runtime's own mmap is refused, a fatal error), every connection echo, and those past
# the share fall back naming vm.max_map_count.
mem_steps() {
  go_step mem_memlock rsock rsock '^TestMemlockFallback$'
  go_step mem_ring_growth rsock/internal/rdma rdma '^TestRingGrows$'
  (
    export RSOCK_TEST_SYSCTL=1
    go_step mem_max_map_count rsock rsock '^TestMaxMapCount$'
  )
}

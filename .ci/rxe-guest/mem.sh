# mem.sh: registered memory against the kernel's limits (busybox sh, sourced by /init).
#
# mem_memlock: rsock's TestMemlockFallback over rdma-core on rxe. The test binary runs
# itself again as the user nobody (no CAP_IPC_LOCK) with RLIMIT_MEMLOCK at 128 KiB, the
# `ulimit -l 128` of a small container: connections fall back to TCP with a reason that
# names RLIMIT_MEMLOCK and the figures, both when rsock's own check stops them and when
# the kernel's ENOMEM does (memory pinned outside rsock), and the bytes still flow.
mem_steps() {
  go_step mem_memlock rsock rsock '^TestMemlockFallback$'
}

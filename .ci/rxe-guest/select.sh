# select.sh: device selection on a real GID table with holes (busybox sh, sourced by
# /init). Issue 19: with addresses 10.77.0.2-9 added and .3-.5 deleted, a server on .9
# connected on "rdma" with the source GID index taken as a position among the populated
# entries, and no byte arrived. Here, on a device of its own:
#   1. rxe_sel on sel0, one end of a veth pair with nothing on the other (an Ethernet
#      device: the kernel fills the GID table of an rxe on lo, whose type is loopback,
#      only at creation, and ignores later address changes), 10.77.0.2-9 added, then
#      .3-.5 deleted: the table keeps holes where they were.
#   2. The engine's TestEveryLocalGID (RSOCK_TEST_NETDEV=sel0) connects a pair of
#      endpoints from every IPv4 RoCE v2 GID of sel0, 10.77.0.9 included (both ends on
#      rxe_sel, which loops the packets back), logs the source GID index each used and
#      moves verified data both ways; the index logged for 10.77.0.9 must be the one
#      sysfs lists, which differs from its position among the populated entries.
#   3. The echo example on 10.77.0.9: both ends must report rdma, and rxe_sel must both
#      send and receive packets (with the wrong index it sent and received none).
# The device, the interface and its addresses are removed at the end.

SELECT_NET=10.77.0

# select_addrs <add|del> <last octets...>
select_addrs() {
  local op=$1 i
  shift
  for i in "$@"; do ip addr "$op" $SELECT_NET.$i/32 dev sel0 || return 1; done
}

# populated_before <device> <index>: how many populated GID entries precede the index.
populated_before() {
  local f n=0
  for f in $(grep -L '^0000:0000:0000:0000:0000:0000:0000:0000$' /sys/class/infiniband/"$1"/ports/1/gids/*); do
    [ "${f##*/}" -lt "$2" ] && n=$((n + 1))
  done
  echo $n
}

select_gid_holes() {
  local rc=0
  ip link add sel0 type veth peer name sel1 && ip link set sel1 up && ip link set sel0 up || return 1
  if rdma link add rxe_sel type rxe netdev sel0; then
    select_gid_holes_run || rc=1
    rdma link del rxe_sel
  else
    rc=1
  fi
  ip link del sel0
  return $rc
}

select_gid_holes_run() {
  local n=0 idx pos s0 r0 s1 r1 spid crc src
  select_addrs add 2 3 4 5 6 7 8 9 || return 1
  while ! gid_index rxe_sel $SELECT_NET.9 > /dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
  select_addrs del 3 4 5 || return 1
  n=0
  while gid_index rxe_sel $SELECT_NET.5 > /dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
  show_device rxe_sel
  idx=$(gid_index rxe_sel $SELECT_NET.9) || { echo "no RoCE v2 GID for $SELECT_NET.9 on rxe_sel"; return 1; }
  pos=$(populated_before rxe_sel "$idx")
  echo "$SELECT_NET.9: hardware GID index $idx, position $pos among the populated entries"
  [ "$idx" != "$pos" ] || { echo "the table has no hole before $SELECT_NET.9"; return 1; }

  (
    cd /t/src/rsock/internal/rdma || exit 1
    RSOCK_TEST_NETDEV=sel0 timeout -k 10 $((GO_TIMEOUT + 60)) /t/bin/rdma.test -test.v -test.count=1 \
      -test.timeout="${GO_TIMEOUT}s" -test.run '^TestEveryLocalGID$'
  ) > /tmp/select.log 2>&1
  crc=$?
  cat /tmp/select.log
  [ $crc = 0 ] || { echo "TestEveryLocalGID failed ($crc)"; return 1; }
  expect /tmp/select.log "rxe_sel port 1: $SELECT_NET.9 at GID index $idx \\(position $pos " \
    "the engine's source GID index for $SELECT_NET.9 on rxe_sel" || return 1
  expect /tmp/select.log '--- PASS: TestEveryLocalGID/default-ibv' "the run on the kernel device" || return 1

  s0=$(ctr rxe_sel sent_pkts) r0=$(ctr rxe_sel rcvd_pkts)
  # Both ends on one host would take shared memory (shm): this step is about the NIC.
  RSOCK_DISABLE_SHM=1 timeout -k 5 60 /t/bin/echo_server -addr $SELECT_NET.9:7100 > /tmp/sel_server.log 2>&1 &
  spid=$!
  wait_listen 7100 $spid || { kill $spid 2>/dev/null; cat /tmp/sel_server.log; return 1; }
  RSOCK_DISABLE_SHM=1 timeout -k 5 60 /t/bin/echo_client -addr $SELECT_NET.9:7100 -msg "across a GID table with holes" > /tmp/sel_client.log 2>&1
  crc=$?
  stop $spid echo_server
  src=$?
  s1=$(ctr rxe_sel sent_pkts) r1=$(ctr rxe_sel rcvd_pkts)
  echo "--- client:"
  cat /tmp/sel_client.log
  echo "--- server:"
  cat /tmp/sel_server.log
  echo "rxe_sel sent_pkts +$((s1 - s0)), rcvd_pkts +$((r1 - r0))"
  [ $crc = 0 ] && [ $src = 0 ] || { echo "echo: client $crc, server $src"; return 1; }
  expect /tmp/sel_client.log "over rdma\$" "the client on rdma" &&
    expect /tmp/sel_client.log '^echo: across a GID table with holes$' "the echo" &&
    expect /tmp/sel_server.log "$SELECT_NET.9:[0-9]+ connected over rdma\$" "the server on rdma" || return 1
  [ $((s1 - s0)) -gt 0 ] && [ $((r1 - r0)) -gt 0 ] ||
    { echo "rxe_sel did not both send and receive"; return 1; }
}

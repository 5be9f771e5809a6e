# select.sh: device selection on a real GID table with holes (busybox sh, sourced by
# /init). Issue 19: with addresses 10.77.0.2-9 added and .3-.5 deleted, a server on .9
# connected on "rdma" with the source GID index taken as a position among the populated
# entries, and no byte arrived. Here:
#   1. 10.77.0.2-9 are added to lo (rxe_lo's netdev, so rxe_lo gets a v1 and a v2 GID
#      for each), then .3-.5 deleted: rxe_lo's table keeps holes where they were.
#   2. The engine's TestEveryLoopbackGID connects a pair of endpoints from every IPv4
#      RoCE v2 GID of rxe_lo, 10.77.0.9 included, logs the source GID index each used
#      and moves verified data both ways; the log's index for 10.77.0.9 must be the one
#      sysfs lists, and differ from its position among the populated entries.
#   3. The echo example on 10.77.0.9: both ends must report rdma, and rxe_lo must both
#      send and receive packets (with the wrong index it sent and received none).
# The addresses are removed at the end.

SELECT_NET=10.77.0

# select_addrs <add|del> <last octets...>
select_addrs() {
  local op=$1 i
  shift
  for i in "$@"; do ip addr "$op" $SELECT_NET.$i/32 dev lo || return 1; done
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
  select_addrs add 2 3 4 5 6 7 8 9 || { select_addrs del 2 3 4 5 6 7 8 9 2>/dev/null; return 1; }
  select_gid_holes_run || rc=1
  select_addrs del 2 6 7 8 9
  return $rc
}

select_gid_holes_run() {
  local n=0 idx pos s0 r0 s1 r1 spid crc src
  while ! gid_index rxe_lo $SELECT_NET.9 > /dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
  select_addrs del 3 4 5 || return 1
  n=0
  while gid_index rxe_lo $SELECT_NET.5 > /dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
  show_device rxe_lo
  idx=$(gid_index rxe_lo $SELECT_NET.9) || { echo "no RoCE v2 GID for $SELECT_NET.9 on rxe_lo"; return 1; }
  pos=$(populated_before rxe_lo "$idx")
  echo "$SELECT_NET.9: hardware GID index $idx, position $pos among the populated entries"
  [ "$idx" != "$pos" ] || { echo "the table has no hole before $SELECT_NET.9"; return 1; }

  (
    cd /t/src/rsock/internal/rdma || exit 1
    timeout -k 10 $((GO_TIMEOUT + 60)) /t/bin/rdma.test -test.v -test.count=1 \
      -test.timeout="${GO_TIMEOUT}s" -test.run '^TestEveryLoopbackGID$'
  ) > /tmp/select.log 2>&1
  crc=$?
  cat /tmp/select.log
  [ $crc = 0 ] || { echo "TestEveryLoopbackGID failed ($crc)"; return 1; }
  expect /tmp/select.log "rxe_lo port 1: $SELECT_NET.9 at GID index $idx \\(position " \
    "the engine's source GID index for $SELECT_NET.9 on rxe_lo" || return 1
  expect /tmp/select.log '--- PASS: TestEveryLoopbackGID/default-ibv' "the run on the kernel device" || return 1

  s0=$(ctr rxe_lo sent_pkts) r0=$(ctr rxe_lo rcvd_pkts)
  timeout -k 5 60 /t/bin/echo_server -addr $SELECT_NET.9:7100 > /tmp/sel_server.log 2>&1 &
  spid=$!
  wait_listen 7100 $spid || { kill $spid 2>/dev/null; cat /tmp/sel_server.log; return 1; }
  timeout -k 5 60 /t/bin/echo_client -addr $SELECT_NET.9:7100 -msg "across a GID table with holes" > /tmp/sel_client.log 2>&1
  crc=$?
  stop $spid echo_server
  src=$?
  s1=$(ctr rxe_lo sent_pkts) r1=$(ctr rxe_lo rcvd_pkts)
  echo "--- client:"
  cat /tmp/sel_client.log
  echo "--- server:"
  cat /tmp/sel_server.log
  echo "rxe_lo sent_pkts +$((s1 - s0)), rcvd_pkts +$((r1 - r0))"
  [ $crc = 0 ] && [ $src = 0 ] || { echo "echo: client $crc, server $src"; return 1; }
  expect /tmp/sel_client.log "over rdma\$" "the client on rdma" &&
    expect /tmp/sel_client.log '^echo: across a GID table with holes$' "the echo" &&
    expect /tmp/sel_server.log "$SELECT_NET.9:[0-9]+ connected over rdma\$" "the server on rdma" || return 1
  [ $((s1 - s0)) -gt 0 ] && [ $((r1 - r0)) -gt 0 ] ||
    { echo "rxe_lo did not both send and receive"; return 1; }
}

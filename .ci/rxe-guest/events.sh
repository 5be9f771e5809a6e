# events.sh: a host's netdev taken down mid-stream (busybox sh, sourced by /init).
#
# streamcheck (internal/cmd/streamcheck) serves on host B (rxe_b on wb) and dials from
# host A (rxe_a on wa); both write and verify a stream each way. Once both have moved
# a MiB, `ip link set wb down`. The step passes when both ends were on rdma, each half
# of each end (its Write and its Read) ended with a named rsock error within
# EVENTS_BOUND_MS of the link going down, and neither read a byte its peer did not
# write. It prints which error each half got, the figures, and restores wb for the
# steps after it.
#
# Two steps: events_port_down strikes mid-stream, events_port_down_idle once both ends
# have stopped writing. Taking wb down makes rxe set both rxe_b and rxe_a (its veth
# peer loses carrier) down and raise IBV_EVENT_PORT_ERR on each; mid-stream, the QPs
# usually fail on their own first (requests in flight end in errors), so the idle step
# is the one that requires the event: host B must fail with "rdma: port went down".

EVENTS_BOUND_MS=${EVENTS_BOUND_MS:-10000}

# field <file> <name>: a key=value field of streamcheck's result line.
field() {
  grep '^result ' "$1" | sed -n "s/.* $2=\\(\"[^\"]*\"\\|[^ ]*\\).*/\\1/p"
}

# restore_wb: wb up again, with the routes and neighbour entries setup_two_hosts made
# that taking it down removed, and rxe_b (and rxe_a, whose veth peer it is) active.
restore_wb() {
  ip link set wb up
  ip route replace $A dev wb table 102
  ip neigh replace $A lladdr "$(cat /sys/class/net/wa/address)" dev wb nud permanent
  ip neigh replace $B lladdr "$(cat /sys/class/net/wb/address)" dev wa nud permanent
  ip route replace local $B dev wb table local proto kernel scope host src $A
  wait_device rxe_b && wait_device rxe_a
}

# port_down [-idle]: the scenario; with -idle the connection is idle when wb goes down,
# and host B must have learnt it from the port event.
port_down() {
  local mode=$1 spid cpid n t0 crc src rc=0 side log other wrote read e at msg
  timeout -k 5 120 /t/bin/streamcheck $mode -listen $B:7600 > /tmp/sc_b.log 2>&1 &
  spid=$!
  wait_listen 7600 $spid || { kill $spid 2>/dev/null; cat /tmp/sc_b.log; return 1; }
  timeout -k 5 120 /t/bin/streamcheck $mode -dial $B:7600 > /tmp/sc_a.log 2>&1 &
  cpid=$!
  n=0
  until grep -q '^streaming' /tmp/sc_a.log && grep -q '^streaming' /tmp/sc_b.log; do
    n=$((n + 1))
    if [ $n -gt 300 ] || ! kill -0 $cpid 2>/dev/null || ! kill -0 $spid 2>/dev/null; then
      echo "the stream never started"
      kill $cpid $spid 2>/dev/null
      wait $cpid; wait $spid
      cat /tmp/sc_a.log /tmp/sc_b.log
      return 1
    fi
    sleep 0.2
  done
  t0=$(/t/bin/streamcheck -now)
  ip link set wb down
  echo "wb down at $t0 ms; rxe_b port $(cat /sys/class/infiniband/rxe_b/ports/1/state), rxe_a port $(cat /sys/class/infiniband/rxe_a/ports/1/state)"
  wait $cpid
  crc=$?
  wait $spid
  src=$?
  echo "--- host A (client):"
  cat /tmp/sc_a.log
  echo "--- host B (server, wb taken down):"
  cat /tmp/sc_b.log
  echo "client exit status $crc, server exit status $src"
  restore_wb || { echo "wb did not come back"; rc=1; }
  [ $crc = 0 ] && [ $src = 0 ] || rc=1
  for side in a b; do
    log=/tmp/sc_$side.log
    other=/tmp/sc_$([ $side = a ] && echo b || echo a).log
    grep -q '^transport rdma$' $log || { echo "host $side was not on rdma"; rc=1; }
    wrote=$(field $other wrote) read=$(field $log read)
    [ -n "$read" ] && [ -n "$wrote" ] && [ "$read" -le "$wrote" ] ||
      { echo "host $side read $read bytes, its peer wrote $wrote"; rc=1; }
    echo "host $side read $read of the $wrote bytes its peer's Write reported ($((wrote - read)) in flight when the link went down)"
    for e in write read; do
      at=$(field $log ${e}_err_ms)
      msg=$(field $log ${e}_err)
      echo "host $side $e: $(( at - t0 )) ms after wb down: $msg"
      echo "$msg" | grep -Eq 'rdma: (port went down|control connection lost|queue pair failed|keepalive timeout|connection closed by peer)' ||
        { echo "host $side $e: not a named rsock error"; rc=1; }
      [ $(( at - t0 )) -le "$EVENTS_BOUND_MS" ] || { echo "host $side $e: later than ${EVENTS_BOUND_MS} ms"; rc=1; }
    done
  done
  if grep -q 'port went down' /tmp/sc_b.log; then
    echo "host B learnt from IBV_EVENT_PORT_ERR that its port went down"
  elif [ "$mode" = -idle ]; then
    echo "host B, idle, did not fail with the port event"
    rc=1
  else
    echo "host B's QP failed before IBV_EVENT_PORT_ERR reached it"
  fi
  return $rc
}

port_down_mid_stream() { port_down ""; }
port_down_idle() { port_down -idle; }

# path.sh: RoCE filtered between the two hosts (busybox sh, sourced by /init).
#
# A firewall that drops RoCE v2 (UDP 4791) while TCP passes is the classic way to get a
# configured but broken RDMA path: both QPs reach RTS, and before rsock proved the path
# the first Write succeeded and its bytes died with the QP. Here tc drops UDP 4791 as it
# leaves either veth end (a u32 filter on the clsact egress hook of wa and wb), so the
# rxe devices' packets never cross, while the bootstrap (TCP, through lo) is untouched.
# A client on A and a server on B must both end on tcp with ErrPathUnproven's text, and
# every byte must arrive: the echo, and gRPC's streams (64 KiB messages checked, a 10 MiB
# upload whose SHA-256 the server checks). (The HTTP example's server also takes plain
# clients, and a first dial slower than its 200 ms sniff, as on this emulated VM, is
# taken for one: it is left out here.)
# The filter's drop counters show that RoCE packets were sent and dropped.

# TC is iproute2's tc, copied into the guest at the host's path: the busybox shell would
# run its own, more limited, tc applet for a bare "tc".
TC=/usr/sbin/tc
[ -x $TC ] || TC=/sbin/tc

# roce_filter add|del: the drop filter on both veth ends.
roce_filter() {
  local d
  for d in wa wb; do
    if [ "$1" = add ]; then
      $TC qdisc add dev $d clsact &&
        $TC filter add dev $d egress protocol ip prio 1 u32 \
          match ip protocol 17 0xff match ip dport 4791 0xffff action drop || return 1
    else
      $TC qdisc del dev $d clsact 2>/dev/null
    fi
  done
  return 0
}

# path_filtered: the step.
path_filtered() {
  local rc=0 why='RDMA path unproven.*UDP 4791'
  roce_filter add || { echo "tc: cannot install the RoCE drop filter"; roce_filter del; return 1; }
  run_pair echo_server 7310 /t/bin/echo_client -addr $B:7310 -msg "across a filtered path" &&
    expect /tmp/ex_client.log "over tcp\$" "the client on tcp" &&
    expect /tmp/ex_client.log "not rdma: .*$why" "the client's reason" &&
    expect /tmp/ex_client.log '^echo: across a filtered path$' "the echo" &&
    expect /tmp/ex_server.log "$A:[0-9]+ connected over tcp.*$why" "the server on tcp, with the reason" || rc=1
  if [ $rc = 0 ]; then
    run_pair grpc_server 9100 /t/bin/grpc_client -addr $B:9100 -calls 200 &&
      expect /tmp/ex_client.log "connected to $B:9100 over tcp" "the gRPC client on tcp" &&
      expect /tmp/ex_client.log "not rdma: .*$why" "the gRPC client's reason" &&
      expect /tmp/ex_client.log 'Digest: 10 MiB sent, the server.s SHA-256 matches' "the upload's digest" || rc=1
  fi
  echo "--- RoCE drop filter counters"
  $TC -s filter show dev wa egress
  $TC -s filter show dev wb egress
  $TC -s filter show dev wa egress | grep -Eq 'Sent [1-9][0-9]* bytes' ||
    { echo "the filter on wa dropped nothing: no RoCE packet was sent"; rc=1; }
  roce_filter del
  return $rc
}

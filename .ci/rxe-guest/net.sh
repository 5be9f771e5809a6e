# net.sh: the guest's RDMA devices and the two hosts (busybox sh, sourced by /init).
#
# rxe_lo: Soft-RoCE on lo. Tests listen on 127.0.0.1, and rsock picks the device whose
# RoCE GID holds the connection's local address, so they run on rxe_lo.
#
# The two hosts, A (10.77.1.1, rxe_a on veth wa) and B (10.77.1.2, rxe_b on veth wb):
# two processes, each on its own rxe device, whose RoCE v2 packets cross the veth wire.
#
# Why not two network namespaces (the obvious design): on the kernels used here (6.1,
# 6.12) rxe opens its UDP socket (port 4791) in init_net only, and routes what it sends
# in init_net too. An rxe device on a veth end moved into another namespace never
# receives: its peer's packets reach that namespace's UDP stack, where nothing listens
# on 4791. NETNS_PROBE=1 runs that experiment with ibv_rc_pingpong (netns_probe below).
#
# So both veth ends stay in init_net, and routing sends rxe's traffic over the wire:
#   - Both addresses are local, so by default a packet from A to B takes the local
#     table's route through lo, reaches no rxe device of the pair, and the QPs time out.
#     rxe routes each packet with the output interface set to its netdev (and the kernel
#     resolves the peer's MAC the same way), so rules keyed on that interface
#     ("oif wa lookup 101"), consulted before the local table (moved from priority 0 to
#     100), send it out of wa to B's MAC, and the reverse out of wb.
#   - On wb the packet from local address A would be a martian: accept_local=1 and
#     rp_filter=0 accept it; it is delivered to the UDP socket, and rxe hands it to the
#     device whose netdev received it, rxe_b.
#   - Static neighbour entries replace ARP between the two ends.
#   - TCP between the hosts (the bootstrap of rsock, perftest, the conformance agent)
#     still goes through lo, which is fine: only the RDMA traffic must cross the wire.
#     A client that does not bind takes the local route's preferred source as its own
#     address, so B's local route names A as the source (and A's names B): a process
#     dialing B is on host A, and rsock picks rxe_a for it.
# prove_wire checks it: ibv_rc_pingpong from rxe_a to rxe_b, with rxe's hw_counters
# and the veth packet counters showing every packet crossing, and none on rxe_lo.

A=10.77.1.1
B=10.77.1.2

# wait_device <device>: until its port is ACTIVE and its GID table lists an address.
wait_device() {
  local n=0
  while [ $n -lt 100 ]; do
    grep -q ACTIVE /sys/class/infiniband/"$1"/ports/1/state 2>/dev/null &&
      grep -ql ffff /sys/class/infiniband/"$1"/ports/1/gids/* 2>/dev/null && return 0
    sleep 0.1
    n=$((n + 1))
  done
  echo "$1: no active port with an IPv4 GID after 10 s"
  return 1
}

# show_device <device>: port state and the populated GIDs with their types.
show_device() {
  local f i
  echo "$1: $(cat /sys/class/infiniband/"$1"/ports/1/state), netdev $(cat /sys/class/infiniband/"$1"/ports/1/gid_attrs/ndevs/0 2>/dev/null)"
  for f in $(grep -L '^0000:0000:0000:0000:0000:0000:0000:0000$' /sys/class/infiniband/"$1"/ports/1/gids/*); do
    i=${f##*/}
    echo "  gid[$i] $(cat "$f") $(cat /sys/class/infiniband/"$1"/ports/1/gid_attrs/types/"$i" 2>/dev/null)"
  done
}

setup_lo() {
  ip link set lo up &&
    rdma link add rxe_lo type rxe netdev lo &&
    wait_device rxe_lo || return 1
  show_device rxe_lo
  ibv_devinfo -d rxe_lo | grep -E 'hca_id|transport|fw_ver|state|active_mtu|link_layer'
}

setup_two_hosts() {
  local c
  ip link add wa type veth peer name wb || return 1
  ip addr add $A/32 dev wa && ip addr add $B/32 dev wb || return 1
  ip link set wa up && ip link set wb up || return 1
  for c in all wa wb; do
    echo 1 > /proc/sys/net/ipv4/conf/$c/accept_local
    echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter
  done
  ip rule add pref 100 lookup local && ip rule del pref 0 || return 1
  ip rule add pref 10 oif wa lookup 101 && ip rule add pref 11 oif wb lookup 102 || return 1
  ip route add $B dev wa table 101 && ip route add $A dev wb table 102 || return 1
  ip neigh replace $B lladdr "$(cat /sys/class/net/wb/address)" dev wa nud permanent || return 1
  ip neigh replace $A lladdr "$(cat /sys/class/net/wa/address)" dev wb nud permanent || return 1
  ip route replace local $B dev wb table local proto kernel scope host src $A || return 1
  ip route replace local $A dev wa table local proto kernel scope host src $B || return 1
  rdma link add rxe_a type rxe netdev wa && rdma link add rxe_b type rxe netdev wb || return 1
  wait_device rxe_a && wait_device rxe_b || return 1
  ip rule show
  ip route show table local | grep 10.77
  ip -4 route get $B oif wa
  ip -4 route get $B
  show_device rxe_a
  show_device rxe_b
  rdma link show
}

# prove_wire: ibv_rc_pingpong between the hosts; the counters must show the packets on
# rxe_a, the veth pair and rxe_b, and none on rxe_lo.
prove_wire() {
  local ga gb n=500 s0 r0 w0 x0 l0 s1 r1 w1 x1 l1 crc src
  ga=$(gid_index rxe_a $A) && gb=$(gid_index rxe_b $B) || { echo "no RoCE v2 GID for $A or $B"; return 1; }
  s0=$(ctr rxe_a sent_pkts) r0=$(ctr rxe_b rcvd_pkts) w0=$(netctr wa tx) x0=$(netctr wb rx) l0=$(ctr rxe_lo rcvd_pkts)
  timeout -k 5 60 ibv_rc_pingpong -d rxe_b -g "$gb" -n $n > /tmp/pp_b.log 2>&1 &
  local spid=$!
  wait_listen 18515 $spid || { kill $spid 2>/dev/null; return 1; }
  timeout -k 5 60 ibv_rc_pingpong -d rxe_a -g "$ga" -n $n $B
  crc=$?
  wait $spid
  src=$?
  echo "--- host B (server):"
  cat /tmp/pp_b.log
  s1=$(ctr rxe_a sent_pkts) r1=$(ctr rxe_b rcvd_pkts) w1=$(netctr wa tx) x1=$(netctr wb rx) l1=$(ctr rxe_lo rcvd_pkts)
  echo "rxe_a sent_pkts +$((s1 - s0)), wa tx +$((w1 - w0)), wb rx +$((x1 - x0)), rxe_b rcvd_pkts +$((r1 - r0)), rxe_lo rcvd_pkts +$((l1 - l0))"
  [ $crc = 0 ] && [ $src = 0 ] || { echo "ibv_rc_pingpong: client $crc, server $src"; return 1; }
  [ $((s1 - s0)) -ge $n ] && [ $((w1 - w0)) -ge $n ] && [ $((x1 - x0)) -ge $n ] &&
    [ $((r1 - r0)) -ge $n ] && [ $((l1 - l0)) = 0 ] || { echo "the packets did not all cross the veth pair"; return 1; }
  echo "every packet crossed the veth pair: rxe_a -> wa -> wb -> rxe_b"
}

# netns_probe: the design that does not work here, kept as an experiment (NETNS_PROBE=1):
# rxe devices on a veth pair whose ends are in two namespaces, ibv_rc_pingpong between.
netns_probe() {
  local ga gb crc src
  mkdir -p /run/netns
  ip netns add ha && ip netns add hb || return 1
  ip link add pa type veth peer name pb || return 1
  ip link set pa netns ha && ip link set pb netns hb || return 1
  ip -n ha addr add 10.88.0.1/24 dev pa && ip -n ha link set pa up && ip -n ha link set lo up
  ip -n hb addr add 10.88.0.2/24 dev pb && ip -n hb link set pb up && ip -n hb link set lo up
  ip netns exec ha rdma link add rxe_na type rxe netdev pa || echo "rdma link add rxe_na failed"
  ip netns exec hb rdma link add rxe_nb type rxe netdev pb || echo "rdma link add rxe_nb failed"
  wait_device rxe_na; wait_device rxe_nb
  rdma link show
  ga=$(gid_index rxe_na 10.88.0.1) gb=$(gid_index rxe_nb 10.88.0.2)
  echo "GID indices: rxe_na $ga, rxe_nb $gb"
  ip netns exec hb timeout -k 5 30 ibv_rc_pingpong -d rxe_nb -g "$gb" -n 100 > /tmp/pp_nb.log 2>&1 &
  local spid=$!
  sleep 2
  ip netns exec ha timeout -k 5 30 ibv_rc_pingpong -d rxe_na -g "$ga" -n 100 10.88.0.2
  crc=$?
  wait $spid
  src=$?
  echo "--- server in hb:"
  cat /tmp/pp_nb.log
  echo "client rc=$crc server rc=$src"
  for d in rxe_na rxe_nb; do echo "$d sent_pkts=$(ctr $d sent_pkts) rcvd_pkts=$(ctr $d rcvd_pkts) retry_exceeded_err=$(ctr $d retry_exceeded_err 2>/dev/null)"; done
  ip -n ha -s link show pa
  ip -n hb -s link show pb
  cat /proc/net/snmp | grep -A1 '^Udp:'
  ip netns exec hb cat /proc/net/snmp | grep -A1 '^Udp:'
  rdma link del rxe_na; rdma link del rxe_nb
  ip netns del ha; ip netns del hb
  [ $crc = 0 ] && [ $src = 0 ]
}

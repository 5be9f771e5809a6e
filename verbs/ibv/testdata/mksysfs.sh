#!/bin/sh
# mksysfs.sh builds the fake sysfs trees the sysfs tests read. Run it from this
# directory; it replaces the sysfs-* trees. Each tree mirrors the layout of
# /sys/class/infiniband on a real host:
#
#   <dev>/ports/<n>/state                     "4: ACTIVE", "1: DOWN"
#   <dev>/ports/<n>/link_layer                "Ethernet" or "InfiniBand"
#   <dev>/ports/<n>/gids/<i>                  eight groups of four hex digits
#   <dev>/ports/<n>/gid_attrs/types/<i>       "RoCE v2" or "IB/RoCE v1"
#   <dev>/ports/<n>/gid_attrs/ndevs/<i>       network interface name
#   <dev>/device/net/<ifname>/dev_port        0-based port of an IPoIB interface
#   <dev>/device/net/<ifname>/type            32 (ARPHRD_INFINIBAND)
#   <dev>/node_type                           "1: CA", "4: RNIC" (iWARP)
#   <dev>/parent                              Soft-RoCE (rxe) only: its netdev
#
# Unused GID entries read as all zeros and have no types/ndevs files here (the
# kernel fails the read instead); neither do InfiniBand GIDs have an ndevs file.
# Git keeps no empty directories, so the code must not depend on them.
set -eu

zero=0000:0000:0000:0000:0000:0000:0000:0000

port() { # tree dev port state link_layer
	d=$1/class/infiniband/$2/ports/$3
	mkdir -p "$d/gids" "$d/gid_attrs/types" "$d/gid_attrs/ndevs"
	echo "$4" >"$d/state"
	echo "$5" >"$d/link_layer"
}

gid() { # tree dev port index gid [type ndev]
	d=$1/class/infiniband/$2/ports/$3
	echo "$5" >"$d/gids/$4"
	if [ $# -ge 7 ]; then
		echo "$6" >"$d/gid_attrs/types/$4"
		[ -z "$7" ] || echo "$7" >"$d/gid_attrs/ndevs/$4"
	fi
}

ipoib() { # tree dev ifname dev_port
	d=$1/class/infiniband/$2/device/net/$3
	mkdir -p "$d"
	echo 32 >"$d/type" # ARPHRD_INFINIBAND; also keeps the directory in git
	[ -z "$4" ] || echo "$4" >"$d/dev_port"
}

node_type() { # tree dev "n: NAME"
	mkdir -p "$1/class/infiniband/$2"
	echo "$3" >"$1/class/infiniband/$2/node_type"
}

# roce_addr tree dev port first-index gid ndev: a v1 and a v2 entry for one address.
roce_addr() {
	gid "$1" "$2" "$3" "$4" "$5" "IB/RoCE v1" "$6"
	gid "$1" "$2" "$3" $(($4 + 1)) "$5" "RoCE v2" "$6"
}

rm -rf sysfs-roce sysfs-multi sysfs-ib sysfs-empty sysfs-fake sysfs-holes sysfs-iwarp

# sysfs-roce: one RoCE device, eth0 holds 10.0.0.5, fd00::5 and a link-local address;
# a second one, mlx5_1, whose eth1 has the same link-local address (cloned MACs):
# only the zone tells them apart.
t=sysfs-roce
node_type $t mlx5_0 "1: CA"
port $t mlx5_0 1 "4: ACTIVE" Ethernet
roce_addr $t mlx5_0 1 0 fe80:0000:0000:0000:0a00:27ff:fe00:0005 eth0
roce_addr $t mlx5_0 1 2 0000:0000:0000:0000:0000:ffff:0a00:0005 eth0
roce_addr $t mlx5_0 1 4 fd00:0000:0000:0000:0000:0000:0000:0005 eth0
gid $t mlx5_0 1 6 $zero
gid $t mlx5_0 1 7 $zero
node_type $t mlx5_1 "1: CA"
port $t mlx5_1 1 "4: ACTIVE" Ethernet
roce_addr $t mlx5_1 1 0 fe80:0000:0000:0000:0a00:27ff:fe00:0005 eth1

# sysfs-multi: several devices.
#   mlx5_0 port 1 ACTIVE: eth0 10.0.0.5
#   mlx5_1 port 1 DOWN:   eth1 10.1.0.5, and 10.9.0.5 also held by mlx5_2 port 2
#   mlx5_2 port 1 ACTIVE: eth2 10.2.0.5, RoCE v1 only (no v2 entry)
#   mlx5_2 port 2 ACTIVE: eth3 10.3.0.5 and 10.9.0.5
#   rxe0   port 1 ACTIVE: no gid_attrs (old kernel): 10.4.0.5 reads as RoCE v1
t=sysfs-multi
port $t mlx5_0 1 "4: ACTIVE" Ethernet
roce_addr $t mlx5_0 1 0 fe80:0000:0000:0000:0a00:27ff:fe00:0005 eth0
roce_addr $t mlx5_0 1 2 0000:0000:0000:0000:0000:ffff:0a00:0005 eth0
gid $t mlx5_0 1 4 $zero
port $t mlx5_1 1 "1: DOWN" Ethernet
roce_addr $t mlx5_1 1 0 0000:0000:0000:0000:0000:ffff:0a01:0005 eth1
roce_addr $t mlx5_1 1 2 0000:0000:0000:0000:0000:ffff:0a09:0005 eth1
port $t mlx5_2 1 "4: ACTIVE" Ethernet
gid $t mlx5_2 1 0 0000:0000:0000:0000:0000:ffff:0a02:0005 "IB/RoCE v1" eth2
port $t mlx5_2 2 "4: ACTIVE" Ethernet
roce_addr $t mlx5_2 2 0 0000:0000:0000:0000:0000:ffff:0a03:0005 eth3
roce_addr $t mlx5_2 2 2 0000:0000:0000:0000:0000:ffff:0a09:0005 eth3
port $t rxe0 1 "4: ACTIVE" Ethernet
echo eth4 >$t/class/infiniband/rxe0/parent
rm -r $t/class/infiniband/rxe0/ports/1/gid_attrs
gid $t rxe0 1 0 0000:0000:0000:0000:0000:ffff:0a04:0005

# sysfs-ib: InfiniBand with IPoIB.
#   mlx5_0: ports 1 and 2 ACTIVE; ib0 (dev_port 0) and ib1 (dev_port 1)
#   mlx5_1: port 1 DOWN; ib2 (no dev_port, single port)
#   mlx4_0: port 1 ACTIVE; its interface is named by gid_attrs/ndevs only (ib3)
t=sysfs-ib
node_type $t mlx5_0 "1: CA"
node_type $t mlx5_1 "1: CA"
port $t mlx5_0 1 "4: ACTIVE" InfiniBand
gid $t mlx5_0 1 0 fe80:0000:0000:0000:0002:c903:0001:0001 "IB/RoCE v1" ""
gid $t mlx5_0 1 1 $zero
port $t mlx5_0 2 "4: ACTIVE" InfiniBand
gid $t mlx5_0 2 0 fe80:0000:0000:0000:0002:c903:0001:0002
ipoib $t mlx5_0 ib0 0
ipoib $t mlx5_0 ib1 1
port $t mlx5_1 1 "1: DOWN" InfiniBand
gid $t mlx5_1 1 0 fe80:0000:0000:0000:0002:c903:0002:0001
ipoib $t mlx5_1 ib2 ""
port $t mlx4_0 1 "4: ACTIVE" InfiniBand
gid $t mlx4_0 1 0 $zero
gid $t mlx4_0 1 1 fe80:0000:0000:0000:0002:c903:0003:0001 "IB/RoCE v1" ib3

# sysfs-fake: the device of fakeverbs/fakeverbs.c, the test double of libibverbs.
t=sysfs-fake
port $t fake0 1 "4: ACTIVE" Ethernet
roce_addr $t fake0 1 0 fe80:0000:0000:0000:0a00:27ff:fe00:0007 eth7
roce_addr $t fake0 1 2 0000:0000:0000:0000:0000:ffff:0a07:0007 eth7
gid $t fake0 1 4 $zero

# sysfs-holes: a GID table with holes, as rxe leaves it when addresses are deleted:
# eth0's link-local address at indices 0 and 1, 10.77.0.2 and 10.77.0.3 deleted from
# 2 to 5, 10.77.0.9 at hardware indices 6 and 7 (positions 2 and 3 among the populated
# entries), and unused entries up to 9.
t=sysfs-holes
port $t rxe0 1 "4: ACTIVE" Ethernet
echo eth0 >$t/class/infiniband/rxe0/parent
roce_addr $t rxe0 1 0 fe80:0000:0000:0000:5054:00ff:fe12:3456 eth0
for i in 2 3 4 5; do gid $t rxe0 1 $i $zero; done
roce_addr $t rxe0 1 6 0000:0000:0000:0000:0000:ffff:0a4d:0009 eth0
for i in 8 9; do gid $t rxe0 1 $i $zero; done

# sysfs-iwarp: an iWARP RNIC (its GIDs are MAC-based, not addresses) whose eth5 holds
# 10.5.0.5, and a RoCE device holding 10.6.0.5.
t=sysfs-iwarp
node_type $t iwp0 "4: RNIC"
port $t iwp0 1 "4: ACTIVE" Ethernet
gid $t iwp0 1 0 0007:4321:0055:0000:0000:0000:0000:0000
mkdir -p $t/class/infiniband/iwp0/device/net/eth5
echo 1 >$t/class/infiniband/iwp0/device/net/eth5/type # ARPHRD_ETHER
node_type $t mlx5_0 "1: CA"
port $t mlx5_0 1 "4: ACTIVE" Ethernet
roce_addr $t mlx5_0 1 0 0000:0000:0000:0000:0000:ffff:0a06:0005 eth6

# sysfs-empty: the class directory exists but holds no device.
mkdir -p sysfs-empty/class/infiniband
touch sysfs-empty/class/infiniband/.keep

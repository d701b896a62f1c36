#!/bin/bash
# Writes the doctor's fixture trees (sysfs and procfs as the kernel lays them out,
# Documentation/ABI/stable/sysfs-class-infiniband, sysfs-bus-pci, sysfs-class-net; /proc/net/route
# as net/ipv4/fib_trie.c prints it on a little-endian machine). Hand-made, not copied from a
# machine: only the attributes the doctor reads. Run from this directory; it replaces both trees.
#
#   roce-2dev  two fused devices, RoCE v2, two GPUs on two NUMA nodes, every NIC on its
#              GPU's PCIe switch: healthy with MPIB_HCA_SOUT=mlx5_0,mlx5_2 MPIB_HCA_SUP=mlx5_1,mlx5_3
#   ib-sup-down one device: SOUT on InfiniBand (ib0 for the control path), SUP RoCE with its
#              link down; no GPU
#   roce-mesh  one device on a direct-attach mesh, no GPU: SOUT mlx5_0 (eth0), SUP
#              mlx5_8+mlx5_9+mlx5_10, each on a /31 to one neighbour (eth8 10.9.12.0,
#              eth9 10.9.13.0, eth10 10.9.14.0), mlx5_9's link down
#
# Every HCA has its verbs device (sys/class/infiniband_verbs/uverbsN, and a regular file
# standing in for dev/infiniband/uverbsN: the doctor only opens it) and a one-entry P_Key table.
set -euo pipefail
cd "$(dirname "$0")"

# dev ROOT PATH VENDOR CLASS NUMA: a PCI function under sys/devices, linked from sys/bus/pci.
dev() {
	local root=$1 path=$2 vendor=$3 class=$4 numa=$5
	local d=$root/sys/devices/$path bdf=${path##*/}
	mkdir -p "$d" "$root/sys/bus/pci/devices"
	echo "$vendor" >"$d/vendor"; echo "$class" >"$d/class"; echo "$numa" >"$d/numa_node"
	ln -s "../../../devices/$path" "$root/sys/bus/pci/devices/$bdf"
}

# verbs ROOT PCIPATH NAME: the HCA's uverbs device, the next free uverbsN.
verbs() {
	local root=$1 path=$2 name=$3 n v
	mkdir -p "$root/sys/class/infiniband_verbs" "$root/dev/infiniband"
	echo 6 >"$root/sys/class/infiniband_verbs/abi_version"
	n=$(find "$root/sys/class/infiniband_verbs" -mindepth 1 -maxdepth 1 -name 'uverbs*' | wc -l)
	v=$root/sys/devices/$path/infiniband_verbs/uverbs$n
	mkdir -p "$v"; echo "$name" >"$v/ibdev"
	ln -s "../../devices/$path/infiniband_verbs/uverbs$n" "$root/sys/class/infiniband_verbs/uverbs$n"
	: >"$root/dev/infiniband/uverbs$n"
}

# hca ROOT PCIPATH NAME LINKLAYER STATE PHYS RATE: an RDMA device with port 1.
hca() {
	local root=$1 path=$2 name=$3 ll=$4 state=$5 phys=$6 rate=$7
	local d=$root/sys/devices/$path/infiniband/$name
	mkdir -p "$d/ports/1/gids" "$d/ports/1/gid_attrs/types" "$d/ports/1/gid_attrs/ndevs" "$d/ports/1/pkeys" \
		"$root/sys/class/infiniband"
	ln -s "../../../${path##*/}" "$d/device"
	ln -s "../../devices/$path/infiniband/$name" "$root/sys/class/infiniband/$name"
	echo "$ll" >"$d/ports/1/link_layer"; echo "$state" >"$d/ports/1/state"
	echo "$phys" >"$d/ports/1/phys_state"; echo "$rate" >"$d/ports/1/rate"
	for i in 0 1 2 3 4 5 6 7; do echo 0000:0000:0000:0000:0000:0000:0000:0000 >"$d/ports/1/gids/$i"; done
	echo 0xffff >"$d/ports/1/pkeys/0"
	verbs "$root" "$path" "$name"
}

# gid ROOT PCIPATH NAME INDEX GID TYPE NDEV
gid() {
	local p=$1/sys/devices/$2/infiniband/$3/ports/1
	echo "$5" >"$p/gids/$4"; echo "$6" >"$p/gid_attrs/types/$4"
	[ -z "$7" ] || echo "$7" >"$p/gid_attrs/ndevs/$4"
}

# roce ROOT PCIPATH NAME NETDEV MAC-GID-TAIL IPV4-GID-TAIL: the four GIDs rxe and mlx5 show.
roce() {
	gid "$1" "$2" "$3" 0 "fe80:0000:0000:0000:$5" "IB/RoCE v1" "$4"
	gid "$1" "$2" "$3" 1 "fe80:0000:0000:0000:$5" "RoCE v2" "$4"
	gid "$1" "$2" "$3" 2 "0000:0000:0000:0000:0000:ffff:$6" "IB/RoCE v1" "$4"
	gid "$1" "$2" "$3" 3 "0000:0000:0000:0000:0000:ffff:$6" "RoCE v2" "$4"
}

# netdev ROOT PCIPATH NAME MTU
netdev() {
	local d=$1/sys/devices/$2/net/$3
	mkdir -p "$d" "$1/sys/class/net"; echo "$4" >"$d/mtu"; echo up >"$d/operstate"
	ln -s "../../devices/$2/net/$3" "$1/sys/class/net/$3"
}

route_header=$'Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT'
route() { printf '%s\t%s\t%s\t%s\t0\t0\t0\t%s\t0\t0\t0\n' "$@"; }

rm -rf roce-2dev ib-sup-down roce-mesh

r=roce-2dev
sw0=pci0000:17/0000:17:01.0/0000:18:00.0
sw1=pci0000:97/0000:97:01.0/0000:98:00.0
dev $r pci0000:17/0000:17:01.0 0x8086 0x060400 0
dev $r $sw0 0x1000 0x060400 0
dev $r $sw0/0000:19:00.0 0x1000 0x060400 0
dev $r $sw0/0000:19:00.0/0000:1a:00.0 0x15b3 0x020000 0
dev $r $sw0/0000:19:00.0/0000:1a:00.1 0x15b3 0x020000 0
dev $r $sw0/0000:19:01.0 0x1000 0x060400 0
dev $r $sw0/0000:19:01.0/0000:1b:00.0 0x10de 0x030200 0
dev $r pci0000:97/0000:97:01.0 0x8086 0x060400 1
dev $r $sw1 0x1000 0x060400 1
dev $r $sw1/0000:99:00.0 0x1000 0x060400 1
dev $r $sw1/0000:99:00.0/0000:9a:00.0 0x15b3 0x020000 1
dev $r $sw1/0000:99:00.0/0000:9a:00.1 0x15b3 0x020000 1
dev $r $sw1/0000:99:01.0 0x1000 0x060400 1
dev $r $sw1/0000:99:01.0/0000:9b:00.0 0x10de 0x030200 1
dev $r pci0000:00/0000:00:1f.0 0x8086 0x060100 0    # an ISA bridge: not a GPU
dev $r pci0000:00/0000:00:02.0 0x10de 0x068000 0    # an NVIDIA bridge (NVSwitch-like): not a GPU
hca $r $sw0/0000:19:00.0/0000:1a:00.0 mlx5_0 Ethernet "4: ACTIVE" "5: LinkUp" "200 Gb/sec (4X HDR)"
hca $r $sw0/0000:19:00.0/0000:1a:00.1 mlx5_1 Ethernet "4: ACTIVE" "5: LinkUp" "200 Gb/sec (4X HDR)"
hca $r $sw1/0000:99:00.0/0000:9a:00.0 mlx5_2 Ethernet "4: ACTIVE" "5: LinkUp" "200 Gb/sec (4X HDR)"
hca $r $sw1/0000:99:00.0/0000:9a:00.1 mlx5_3 Ethernet "4: ACTIVE" "5: LinkUp" "200 Gb/sec (4X HDR)"
netdev $r $sw0/0000:19:00.0/0000:1a:00.0 eth0 9000
netdev $r $sw0/0000:19:00.0/0000:1a:00.1 eth1 9000
netdev $r $sw1/0000:99:00.0/0000:9a:00.0 eth2 9000
netdev $r $sw1/0000:99:00.0/0000:9a:00.1 eth3 9000
roce $r $sw0/0000:19:00.0/0000:1a:00.0 mlx5_0 eth0 0a00:27ff:fe00:0000 0a00:010b   # 10.0.1.11
roce $r $sw0/0000:19:00.0/0000:1a:00.1 mlx5_1 eth1 0a00:27ff:fe00:0001 0a09:010b   # 10.9.1.11
roce $r $sw1/0000:99:00.0/0000:9a:00.0 mlx5_2 eth2 0a00:27ff:fe00:0002 0a00:030b   # 10.0.3.11
roce $r $sw1/0000:99:00.0/0000:9a:00.1 mlx5_3 eth3 0a00:27ff:fe00:0003 0a09:030b   # 10.9.3.11
mkdir -p $r/proc/net
{
	echo "$route_header"
	route eth0 0001000A 00000000 0001 00FFFFFF   # 10.0.1.0/24
	route eth0 0002000A 0101000A 0003 00FFFFFF   # 10.0.2.0/24 via 10.0.1.1
	route eth1 0001090A 00000000 0001 00FFFFFF   # 10.9.1.0/24
	route eth2 0003000A 00000000 0001 00FFFFFF   # 10.0.3.0/24
	route eth3 0003090A 00000000 0001 00FFFFFF   # 10.9.3.0/24
} >$r/proc/net/route
cat >$r/ip-addr <<'ADDRS'
# NETDEV ADDRESS/PREFIX, as `ip -o addr` lists them (the doctor's fixture convention)
lo 127.0.0.1/8
eth0 10.0.1.11/24
eth1 10.9.1.11/24
eth2 10.0.3.11/24
eth3 10.9.3.11/24
ADDRS

r=ib-sup-down
ad=pci0000:3a/0000:3a:00.0
dev $r $ad 0x8086 0x060400 0
dev $r $ad/0000:3b:00.0 0x15b3 0x020700 0
dev $r $ad/0000:3b:00.1 0x15b3 0x020000 0
hca $r $ad/0000:3b:00.0 mlx5_0 InfiniBand "4: ACTIVE" "5: LinkUp" "100 Gb/sec (4X EDR)"
hca $r $ad/0000:3b:00.1 mlx5_1 Ethernet "1: DOWN" "3: Disabled" "100 Gb/sec (4X EDR)"
gid $r $ad/0000:3b:00.0 mlx5_0 0 fe80:0000:0000:0000:0002:c903:0001:0001 "IB/RoCE v1" ""
netdev $r $ad/0000:3b:00.0 ib0 2044
netdev $r $ad/0000:3b:00.1 eth1 1500
roce $r $ad/0000:3b:00.1 mlx5_1 eth1 0a00:27ff:fe00:0011 0a09:010b   # 10.9.1.11
mkdir -p $r/proc/net
{
	echo "$route_header"
	route ib0 0001000A 00000000 0001 00FFFFFF    # 10.0.1.0/24; eth1's left with its link
} >$r/proc/net/route
cat >$r/ip-addr <<'ADDRS'
lo 127.0.0.1/8
ib0 10.0.1.11/24
eth1 10.9.1.11/24
ADDRS

r=roce-mesh
mp=pci0000:5a/0000:5a:00.0
dev $r $mp 0x8086 0x060400 0
for f in 0000:5b:00.0 0000:5b:00.1 0000:5c:00.0 0000:5c:00.1; do dev $r $mp/$f 0x15b3 0x020000 0; done
hca $r $mp/0000:5b:00.0 mlx5_0 Ethernet "4: ACTIVE" "5: LinkUp" "100 Gb/sec (4X EDR)"
hca $r $mp/0000:5b:00.1 mlx5_8 Ethernet "4: ACTIVE" "5: LinkUp" "100 Gb/sec (4X EDR)"
hca $r $mp/0000:5c:00.0 mlx5_9 Ethernet "1: DOWN" "3: Disabled" "100 Gb/sec (4X EDR)"
hca $r $mp/0000:5c:00.1 mlx5_10 Ethernet "4: ACTIVE" "5: LinkUp" "100 Gb/sec (4X EDR)"
netdev $r $mp/0000:5b:00.0 eth0 9000
netdev $r $mp/0000:5b:00.1 eth8 9000
netdev $r $mp/0000:5c:00.0 eth9 9000
netdev $r $mp/0000:5c:00.1 eth10 9000
roce $r $mp/0000:5b:00.0 mlx5_0 eth0 0a00:27ff:fe00:0020 0a00:010b    # 10.0.1.11
roce $r $mp/0000:5b:00.1 mlx5_8 eth8 0a00:27ff:fe00:0028 0a09:0c00    # 10.9.12.0
roce $r $mp/0000:5c:00.0 mlx5_9 eth9 0a00:27ff:fe00:0029 0a09:0d00    # 10.9.13.0
roce $r $mp/0000:5c:00.1 mlx5_10 eth10 0a00:27ff:fe00:002a 0a09:0e00  # 10.9.14.0
mkdir -p $r/proc/net
{
	echo "$route_header"
	route eth0 0001000A 00000000 0001 00FFFFFF    # 10.0.1.0/24
	route eth8 000C090A 00000000 0001 FEFFFFFF    # 10.9.12.0/31
	route eth10 000E090A 00000000 0001 FEFFFFFF   # 10.9.14.0/31; eth9's left with its link
} >$r/proc/net/route
cat >$r/ip-addr <<'ADDRS'
lo 127.0.0.1/8
eth0 10.0.1.11/24
eth8 10.9.12.0/31
eth9 10.9.13.0/31
eth10 10.9.14.0/31
ADDRS

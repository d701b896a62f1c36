#!/usr/bin/env bash
# Run nccl-tests (all_reduce_perf, sendrecv_perf) under mpirun with the MPIB plugin on a real
# cluster. Every MPIB_* and NCCL_* variable in the environment is passed to every rank (mpirun
# gives remote ranks only what -x names: an NCCL_IB_TC set here would reach this node's ranks
# alone). The launcher sets these itself, each only where the environment leaves it unset:
#   NCCL_NET=MPIB              a rank whose MPIB finds no device fails instead of measuring net_ib
#   NCCL_NET_PLUGIN=mpib       found through LD_LIBRARY_PATH, --plugin-dir first; a path set here
#                              (NCCL_NET_PLUGIN=/opt/mpib/lib/libnccl-net-mpib.so) is kept, another
#                              plugin's name is refused
#   NCCL_DEBUG=WARN            --debug LEVEL sets it whatever the environment says
#   NCCL_DEBUG_SUBSYS=INIT,NET
#   NCCL_SOCKET_IFNAME=OOB_IF  NCCL's bootstrap on the control-path interface; another value set
#                              here is kept (MPIB's own control path is MPIB_OOB_IF)
# and always MPIB_HCA_SOUT, MPIB_HCA_SUP, MPIB_OOB_IF and MPIB_MODE from the options below (or
# the environment), and LD_LIBRARY_PATH (--plugin-dir before this environment's).
#
#   scripts/launch_nccl.sh --hostfile hosts --hca-sout mlx5_0 --hca-sup mlx5_1 [options] [-- test args]
#   scripts/launch_nccl.sh --hostfile hosts --hca-sout mlx5_0,...,mlx5_7 --hca-sup mlx5_8,...,mlx5_15 ...
#
# Every rank gets the same lists: MPIB shows NCCL one fused device per SOUT/SUP pair, and
# NCCL gives each GPU the pair nearest to it (docs/deploying.md). An 8-GPU node with a NIC
# pair per GPU lists eight of each; SUP NICs shared by pairs of GPUs are named twice.
#
# Options:
#   --hostfile FILE        mpirun hostfile (required); "host slots=N" lines are honoured
#   --hca-sout LIST        SOUT HCAs, NAME[:PORT[:RAIL[:PLANE]]],... (or MPIB_HCA_SOUT)
#   --hca-sup LIST         SUP HCAs, NAME[:PORT],..., as many as SOUT's (or MPIB_HCA_SUP); a mesh
#                          device's ports joined by +, NAME[:PORT]+NAME[:PORT]
#   --oob-if IF            control-path interface on the SOUT fabric (or MPIB_OOB_IF; required)
#   --mode 0|1             MPIB_MODE (vanilla or advanced); default: environment or 0
#   --np N                 ranks (default: total slots in the hostfile)
#   --gpus-per-rank N      nccl-tests -g (default 1)
#   --test NAME            all_reduce_perf, sendrecv_perf or both (default both)
#   --nccl-tests DIR       directory with the nccl-tests binaries (default ./nccl-tests/build)
#   --plugin-dir DIR       directory holding libnccl-net-mpib.so (default ./build)
#   --min-bytes / --max-bytes  sweep bounds (default 8 / 1G)
#   --debug LEVEL          NCCL_DEBUG (default: environment or WARN)
#   --dry-run              print the commands instead of running them
#   -h, --help             this text
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "launch_nccl.sh: $*" >&2; exit 2; }

hostfile="" np="" gpus=1 tests="both" dry=0 debug=${NCCL_DEBUG:-WARN}
nccl_tests=./nccl-tests/build plugin_dir=./build min_bytes=8 max_bytes=1G
hca_sout=${MPIB_HCA_SOUT:-} hca_sup=${MPIB_HCA_SUP:-} oob_if=${MPIB_OOB_IF:-} mode=${MPIB_MODE:-0}
extra=()

need_value() { [[ $# -ge 2 && -n $2 && $2 != --* ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --hostfile) need_value "$@"; hostfile=$2; shift 2 ;;
    --hca-sout) need_value "$@"; hca_sout=$2; shift 2 ;;
    --hca-sup) need_value "$@"; hca_sup=$2; shift 2 ;;
    --oob-if) need_value "$@"; oob_if=$2; shift 2 ;;
    --mode) need_value "$@"; mode=$2; shift 2 ;;
    --np) need_value "$@"; np=$2; shift 2 ;;
    --gpus-per-rank) need_value "$@"; gpus=$2; shift 2 ;;
    --test) need_value "$@"; tests=$2; shift 2 ;;
    --nccl-tests) need_value "$@"; nccl_tests=$2; shift 2 ;;
    --plugin-dir) need_value "$@"; plugin_dir=$2; shift 2 ;;
    --min-bytes) need_value "$@"; min_bytes=$2; shift 2 ;;
    --max-bytes) need_value "$@"; max_bytes=$2; shift 2 ;;
    --debug) need_value "$@"; debug=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[[ -n $hostfile ]] || die "--hostfile is required"
[[ -r $hostfile ]] || die "hostfile '$hostfile' is not readable"
[[ -n $hca_sout ]] || die "the SOUT HCA is required (--hca-sout or MPIB_HCA_SOUT)"
[[ -n $hca_sup ]] || die "the SUP HCA is required (--hca-sup or MPIB_HCA_SUP)"
IFS=, read -ra sout_list <<<"$hca_sout"
IFS=, read -ra sup_list <<<"$hca_sup"
[[ ${#sout_list[@]} -eq ${#sup_list[@]} ]] ||
  die "--hca-sout names ${#sout_list[@]} HCAs and --hca-sup ${#sup_list[@]}: they pair by position (repeat a shared SUP NIC)"
# port_of NAME[:PORT[:...]] prints NAME:PORT (port 1 when none is given).
port_of() { local name port; IFS=: read -r name port _ <<<"$1"; echo "$name:${port:-1}"; }
declare -A sout_ports=()
for s in "${sout_list[@]}"; do
  k=$(port_of "$s")
  [[ -z ${sout_ports[$k]:-} ]] || die "--hca-sout names port $k twice: each fused device needs a SOUT port of its own"
  sout_ports[$k]=1
done
for entry in "${sup_list[@]}"; do
  IFS=+ read -ra mesh <<<"$entry"  # a mesh device's SUP ports, NAME[:PORT]+NAME[:PORT]...
  for p in "${mesh[@]}"; do
    k=$(port_of "$p")
    [[ -z ${sout_ports[$k]:-} ]] || die "SOUT and SUP name the same HCA port ($k)"
  done
done
[[ -n $oob_if ]] || die "the control-path interface is required (--oob-if or MPIB_OOB_IF)"
[[ $mode == 0 || $mode == 1 ]] || die "--mode must be 0 or 1, got '$mode'"
[[ $gpus =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-rank must be a positive integer, got '$gpus'"
case $tests in
  both) tests="all_reduce_perf sendrecv_perf" ;;
  all_reduce_perf|sendrecv_perf) ;;
  *) die "--test must be all_reduce_perf, sendrecv_perf or both, got '$tests'" ;;
esac

# Total slots: "host slots=N" counts N, a bare host counts 1; comments and blank lines skip.
slots=$(awk '!/^[[:space:]]*(#|$)/ { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) { split($i, a, "="); n = a[2] } s += n } END { print s + 0 }' "$hostfile")
[[ $slots -gt 0 ]] || die "hostfile '$hostfile' lists no hosts"
np=${np:-$slots}
[[ $np =~ ^[1-9][0-9]*$ ]] || die "--np must be a positive integer, got '$np'"

export MPIB_HCA_SOUT=$hca_sout MPIB_HCA_SUP=$hca_sup MPIB_OOB_IF=$oob_if MPIB_MODE=$mode
plugin_abs=$(cd "$plugin_dir" 2>/dev/null && pwd || echo "$plugin_dir")
plugin=${NCCL_NET_PLUGIN:-mpib}
case $plugin in
  mpib | */*) ;;
  *) die "NCCL_NET_PLUGIN=$plugin names another plugin: unset it, or set it to mpib or to the path of libnccl-net-mpib.so" ;;
esac
if [[ $dry == 0 ]]; then
  if [[ $plugin == mpib ]]; then
    [[ -f $plugin_abs/libnccl-net-mpib.so ]] || die "no libnccl-net-mpib.so in '$plugin_dir' (run: go run mage.go build)"
  else
    [[ -f $plugin ]] || die "NCCL_NET_PLUGIN=$plugin: no such file"
  fi
  command -v mpirun >/dev/null || die "mpirun not found"
fi

# Every MPIB_* and NCCL_* variable of this environment, sorted, each passed with -x; the
# NCCL ones this script sets (the help's list) are passed with their values, the
# environment's where it has one.
export NCCL_NET=${NCCL_NET:-MPIB}
mpib_vars=$(env | sed -n 's/^\(\(MPIB\|NCCL\)_[A-Za-z0-9_]*\)=.*/\1/p' |
  grep -Ev '^NCCL_(NET_PLUGIN|DEBUG|DEBUG_SUBSYS|SOCKET_IFNAME)$' | sort)
xargs_list=(-x "NCCL_NET_PLUGIN=$plugin" -x "LD_LIBRARY_PATH=$plugin_abs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            -x "NCCL_DEBUG=$debug" -x "NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET}"
            -x "NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$oob_if}")
for v in $mpib_vars; do xargs_list+=(-x "$v"); done

for t in $tests; do
  cmd=(mpirun --hostfile "$hostfile" -np "$np" --bind-to none --mca btl_tcp_if_include "$oob_if"
       "${xargs_list[@]}" "$nccl_tests/$t" -b "$min_bytes" -e "$max_bytes" -f 2 -g "$gpus" "${extra[@]}")
  if [[ $dry == 1 ]]; then
    for v in $mpib_vars; do printf '%s=%q ' "$v" "${!v}"; done
    printf '%q ' "${cmd[@]}"; echo
  else
    [[ -x $nccl_tests/$t ]] || die "'$nccl_tests/$t' not found (build nccl-tests, or pass --nccl-tests DIR)"
    "${cmd[@]}"
  fi
done

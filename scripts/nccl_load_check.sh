#!/usr/bin/env bash
# Shows that real NCCL loads libnccl-net-mpib.so by name, picks its newest ABI table, calls init
# and devices, logs through NCCL's logger, and falls back cleanly when no HCA exists.
# Usage (on a GPU machine with NCCL, from the repo root, after `go run mage.go build`):
#   scripts/nccl_load_check.sh [path/to/libnccl.so.2]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
libnccl=${1:-/usr/lib/x86_64-linux-gnu/libnccl.so.2}
export LD_LIBRARY_PATH="$PWD/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NET_PLUGIN=mpib NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET

run_case() {
  local name=$1; shift
  echo "=== case: $name"
  env "$@" python3 scripts/nccl_load_check.py "$libnccl" 2>&1 | grep -E "nccl-load-check|NET/|Plugin|plugin|MPIB|mpib" | sed 's/^/  /'
}

# 1. Configured with HCA names that do not exist on this machine.
run_case missing-hca MPIB_HCA_SOUT=mlx5_0 MPIB_HCA_SUP=mlx5_1 MPIB_OOB_IF=lo
# 2. Not configured at all.
run_case unconfigured
# 3. A bad value.
run_case bad-config MPIB_HCA_SOUT=mlx5_0 MPIB_HCA_SUP=mlx5_1 MPIB_OOB_IF=lo MPIB_MODE=7
# 4. An 8-GPU node's lists (one fused device per NIC pair), on a machine without those NICs.
run_case eight-pairs-missing MPIB_HCA_SOUT=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  MPIB_HCA_SUP=mlx5_8,mlx5_9,mlx5_10,mlx5_11,mlx5_12,mlx5_13,mlx5_14,mlx5_15 MPIB_OOB_IF=lo
# 5. Lists that do not pair (8 SOUT, 4 SUP): a clear error, NCCL moves on.
run_case lists-do-not-pair MPIB_HCA_SOUT=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  MPIB_HCA_SUP=sup0,sup1,sup2,sup3 MPIB_OOB_IF=lo
# 6. A mesh device: two SUP ports joined by '+', on a machine without those NICs.
run_case mesh-ports-missing MPIB_HCA_SOUT=mlx5_0 MPIB_HCA_SUP=mlx5_2+mlx5_3 MPIB_OOB_IF=lo
# 7. A SUP port named twice in one device: a clear error, NCCL moves on.
run_case mesh-port-twice MPIB_HCA_SOUT=mlx5_0 MPIB_HCA_SUP=mlx5_2+mlx5_2:1 MPIB_OOB_IF=lo

#!/bin/bash
# build_netib_ref.sh SRC OUT: builds the benchmarks' net_ib reference, NCCL's IB transport as
# Mellanox's nccl-rdma-sharp-plugins ports it (its "IBext" plugin, the IB layer only: no
# SHARP, no UCX), from a checkout SRC of https://github.com/Mellanox/nccl-rdma-sharp-plugins
# into the shared library OUT. `go run mage.go bench` runs it when MPIB_NETIB_REF_SRC names the
# checkout, and the lab benchmarks then measure it beside MPIB in the same boot
# (docs/benchmarks.md: "net_ib's port, the reference for connect, memory and P4", and "net_ib's
# port beside MPIB").
#
# It compiles the checkout's own sources with gcc, not its autotools build, so that it needs
# only what building MPIB needs (gcc, rdma-core's headers and libraries):
#   - config.h: the verbs features the lab's rdma-core has, which its configure would find;
#   - cuda_runtime.h: the one CUDA type its nccl.h names (the IB layer calls no CUDA);
#   - a constructor that fills ncclNetPlugin_v11 at load: the plugin fills its tables in
#     init, and a loader that checks a table before init (mpib-nettest, as NCCL's own
#     loaders of v11 do not) would refuse it;
#   - one fix to its source: the warning for a device without a PCI path (every soft-RoCE
#     device) passes a char where its format wants a string, and crashes.
# Built with -O3, as MPIB's C and NCCL's net_ib are.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 NCCL_RDMA_SHARP_PLUGINS_CHECKOUT OUT.so" >&2
  exit 2
fi
if [ ! -d "$1" ]; then
  echo "$0: $1 is not a directory" >&2
  exit 1
fi
src=$(cd "$1" && pwd)
sources="ibvwrap.c utils.c param.c socket.c p2p_plugin.c ib_plugin.c"
for f in $sources; do
  if [ ! -f "$src/src/$f" ]; then
    echo "$0: $src/src/$f not found: $1 is not a checkout of nccl-rdma-sharp-plugins" >&2
    exit 1
  fi
done
if ! grep -q 'ibPlugin_v11' "$src/src/ib_plugin.c"; then
  echo "$0: $src/src/ib_plugin.c has no v11 table (ibPlugin_v11): a checkout with NCCL's v11 net API is needed" >&2
  exit 1
fi

mkdir -p "$(dirname "$2")"
out=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/stub"
cp "$src"/src/*.c "$work/src/"
cp -r "$src/include" "$work/include"
sed -i 's/WARN("Could not find real path of %s", \*device_path);/WARN("Could not find real path of %s", device_path);/' \
  "$work/src/p2p_plugin.c"

cat > "$work/config.h" <<'EOF'
#define HAVE_DECL_IBV_ACCESS_RELAXED_ORDERING 1
#define HAVE_DECL_IBV_QPF_GRH_REQUIRED 1
#define HAVE_DECL_IBV_QUERY_ECE 1
#define HAVE_DECL_IBV_REG_DMABUF_MR 1
#define HAVE_DECL_IBV_SET_ECE 1
#define HAVE_DECL_MLX5DV_GET_DATA_DIRECT_SYSFS_PATH 0
#define HAVE_DECL_MLX5DV_REG_DMABUF_MR 0
EOF
cat > "$work/stub/cuda_runtime.h" <<'EOF'
#include <stddef.h>
typedef struct CUstream_st *cudaStream_t;
EOF
cat > "$work/src/fill_tables.c" <<'EOF'
#include "p2p_plugin.h"
extern ncclNet_v11_t ncclNetPlugin_v11;
extern const ncclNet_v11_t ibPlugin_v11;
ncclResult_t pluginInit_v11(void **ctx, uint64_t commId, ncclNetCommConfig_v11_t *config, ncclDebugLogger_t logFunction,
                            ncclProfilerCallback_t profFunction);
/* The IB layer's table, entered through the plugin's own init (which sets its logger). */
__attribute__((constructor)) static void fill_tables(void) {
  ncclNetPlugin_v11 = ibPlugin_v11;
  ncclNetPlugin_v11.init = pluginInit_v11;
}
EOF

cd "$work"
objs=""
for f in $sources fill_tables.c; do
  gcc -O3 -g -fPIC -std=gnu11 -D_GNU_SOURCE -DGNU_SOURCE -include infiniband/mlx5dv.h -I. -Istub -Iinclude \
    -w -c "src/$f" -o "${f%.c}.o"
  objs="$objs ${f%.c}.o"
done
# shellcheck disable=SC2086
gcc -shared -o "$work/lib.so" $objs -libverbs -lmlx5 -ldl -lpthread
mv "$work/lib.so" "$out"
echo "net_ib reference: $out from $src ($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'))"

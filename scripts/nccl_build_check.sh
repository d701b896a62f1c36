#!/usr/bin/env bash
# Builds an NCCL release from its source tree (a release tag of NVIDIA/nccl) just far enough to
# create a communicator, then runs scripts/nccl_load_check.sh against it: which ABI table that
# release takes from libnccl-net-mpib.so, and that init fails cleanly where no HCA exists.
# Usage (on a GPU machine with CUDA's nvcc, from the repo root, after `go run mage.go build`):
#   scripts/nccl_build_check.sh NCCL_SOURCE_DIR
# Environment: NVCC_GENCODE (default: sm_90), CUDA_HOME (default /usr/local/cuda).
#
# Releases before 2.27 do not compile against CUDA 13 as released. Where the tree still uses
# what CUDA 13 removed, the script edits the tree in place (each edit only once; a tree that
# already chooses the form by CUDA version, 2.27+, is left as it is):
#   - src/misc/strongstream.cc: cudaStreamGetCaptureInfo_v2 and the three-argument
#     cudaStreamUpdateCaptureDependencies become the CUDA 13 forms, edge data nullptr;
#   - src/include/cudawrap.h: the unversioned PFN_cu* typedefs it declares are mapped to the
#     newest typedef of CUDA 12.0 or before (a header generated beside it);
#   - src/misc/cudawrap.cc: driver entry points are asked for at version 12000, so that the
#     pointers get the signatures those typedefs declare.
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
src=${1:?usage: scripts/nccl_build_check.sh NCCL_SOURCE_DIR}
[[ -f $src/src/nccl.h.in && -f $src/makefiles/common.mk ]] || {
  echo "nccl-build-check: $src is not an NCCL source tree (no src/nccl.h.in)" >&2
  exit 2
}
cuda=${CUDA_HOME:-/usr/local/cuda}
gencode=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}
major=$("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
echo "nccl-build-check: source=$src cuda_major=$major"

edit_strongstream() {
  local f=$src/src/misc/strongstream.cc
  grep -q 'cudaStreamGetCaptureInfo_v2' "$f" || return 0
  grep -q 'cudaStreamGetCaptureInfo_v3' "$f" && return 0 # 2.27+: chooses by CUDA version itself
  sed -i -e 's/cudaStreamGetCaptureInfo_v2(stream, &status, &gid, &graph->graph, nullptr, nullptr)/cudaStreamGetCaptureInfo(stream, \&status, \&gid, \&graph->graph, nullptr, nullptr, nullptr)/' \
    -e 's/cudaStreamGetCaptureInfo_v2(b, &status, &bGraphId, nullptr, &bNodes, &bCount)/cudaStreamGetCaptureInfo(b, \&status, \&bGraphId, nullptr, \&bNodes, nullptr, \&bCount)/' \
    -e 's/cudaStreamUpdateCaptureDependencies(a, bg->tipNodes, bg->tipCount,/cudaStreamUpdateCaptureDependencies(a, bg->tipNodes, nullptr, bg->tipCount,/' "$f"
  if grep -q 'cudaStreamGetCaptureInfo_v2' "$f"; then
    echo "nccl-build-check: $f calls cudaStreamGetCaptureInfo_v2 in a form this script does not know" >&2
    exit 1
  fi
  echo "nccl-build-check: edited $f for CUDA $major"
}

# The newest PFN_<sym>_v<N> typedef of CUDA 12.0 or before (else the oldest there is).
pfn_version() {
  local sym=$1 typedefs=$cuda/include/cudaTypedefs.h versions
  versions=$(grep -o "PFN_${sym}_v[0-9]*" "$typedefs" | sed "s/PFN_${sym}_v//" | sort -n -u)
  # cuLaunchKernel's v7000 is the per-thread-stream variant's name only.
  [[ $sym == cuLaunchKernel ]] && versions=$(grep -v '^7000$' <<<"$versions")
  awk '$1 <= 12000' <<<"$versions" | tail -1 | grep . || head -1 <<<"$versions"
}

edit_cudawrap() {
  local h=$src/src/include/cudawrap.h c=$src/src/misc/cudawrap.cc compat=$src/src/include/mpib_cuda13_compat.h
  # Only the unversioned form (2.20 .. 2.26): 2.19 names each typedef's version itself.
  grep -q 'extern PFN_##symbol pfn_##symbol' "$h" || return 0
  grep -q '#define PFN_cuDeviceGet ' "$cuda/include/cudaTypedefs.h" && return 0
  [[ -f $compat ]] && return 0
  local sym v
  : >"$compat"
  while read -r sym; do
    [[ $sym == symbol ]] && continue
    v=$(pfn_version "$sym") || true
    if [[ -n $v ]]; then echo "#define PFN_${sym} PFN_${sym}_v${v}" >>"$compat"; fi
  done < <(grep -o 'DECLARE_CUDA_PFN_EXTERN([A-Za-z0-9_]*' "$h" | sed 's/.*(//' | sort -u)
  sed -i 's|#include <cudaTypedefs.h>|#include <cudaTypedefs.h>\n#include "mpib_cuda13_compat.h"|' "$h"
  sed -i 's/cudaGetDriverEntryPoint(#symbol, (void \*\*) (&pfn_##symbol), cudaEnableDefault, &driverStatus)/cudaGetDriverEntryPointByVersion(#symbol, (void **) (\&pfn_##symbol), 12000, cudaEnableDefault, \&driverStatus)/' "$c"
  echo "nccl-build-check: edited $h and $c for CUDA $major ($(wc -l <"$compat") driver typedefs mapped)"
}

if ((major >= 13)); then
  edit_strongstream
  edit_cudawrap
fi
log=$(mktemp)
if ! make -C "$src" -j"$(nproc)" src.build CUDA_HOME="$cuda" ONLY_FUNCS="AllReduce Sum f32 * *" NVCC_GENCODE="$gencode" >"$log" 2>&1; then
  grep -m 10 -E 'error' "$log" >&2 || tail -20 "$log" >&2
  echo "nccl-build-check: the build failed (log: $log)" >&2
  exit 1
fi
echo "nccl-build-check: built $src/build/lib/libnccl.so.2"
exec scripts/nccl_load_check.sh "$(cd "$src" && pwd)/build/lib/libnccl.so.2"

#!/usr/bin/env python3
"""Create a one-rank NCCL communicator through the system libnccl (ctypes, no PyTorch), so that
NCCL loads its net plugins. Run by scripts/nccl_load_check.sh with NCCL_NET_PLUGIN=mpib."""
import ctypes
import sys


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def main() -> int:
    lib = sys.argv[1] if len(sys.argv) > 1 else "libnccl.so.2"
    nccl = ctypes.CDLL(lib)
    version = ctypes.c_int()
    nccl.ncclGetVersion(ctypes.byref(version))
    print(f"nccl-load-check: libnccl={lib} version={version.value}", flush=True)
    uid = UniqueId()
    rc = nccl.ncclGetUniqueId(ctypes.byref(uid))
    if rc != 0:
        print(f"nccl-load-check: ncclGetUniqueId rc={rc}", flush=True)
        return 1
    comm = ctypes.c_void_p()
    rc = nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
    print(f"nccl-load-check: ncclCommInitRank rc={rc}", flush=True)
    if rc == 0:
        nccl.ncclCommDestroy(comm)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

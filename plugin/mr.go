// mr.go: NCCL's memory registration (regMr, regMrDmaBuf and deregMr: mpibGoRegMr and
// mpibGoDeregMr, called by abi_common.c): the checks of what NCCL asks for; mpib_reg_mr and
// mpib_dereg_mr (C) do the rest.

package main

/*
#include "mpib.h"
#include "mpib_device.h"
*/
import "C"

import (
	"unsafe"
)

//export mpibGoRegMr
func mpibGoRegMr(comm unsafe.Pointer, data unsafe.Pointer, size C.size_t, typ C.int, fd C.int, offset C.uint64_t, mhandle *unsafe.Pointer) (rc C.int) {
	defer recoverEntry("regMr", &rc)
	*mhandle = nil
	if typ != C.NCCL_PTR_HOST && typ != C.NCCL_PTR_CUDA {
		warnf("regMr: unsupported memory type %d", int(typ))
		return C.int(resInvalidArgument)
	}
	dev := 0 // NCCL registers with a comm of the device; a NULL comm gets device 0
	if comm != nil {
		dev = int((*C.struct_mpib_comm)(comm).fdev)
	}
	if dev < 0 || dev >= int(C.mpib_g.nfdevs) {
		warnf("regMr: the comm names device %d: %d exist (a closed or foreign comm?)", dev, int(C.mpib_g.nfdevs))
		return C.int(resInvalidArgument)
	}
	if typ == C.NCCL_PTR_CUDA && fd < 0 && C.mpib_g.fdev[dev].prop_ptr_support&C.NCCL_PTR_CUDA == 0 {
		warnf("regMr: CUDA memory without GPUDirect RDMA on device %d (load nvidia_peermem or use DMA-BUF)", dev)
		return C.int(resInvalidUsage)
	}
	var mh *C.struct_mpib_mr
	if rc := C.mpib_reg_mr(C.int(dev), data, size, fd, offset, &mh); rc != 0 {
		return C.int(resSystemError)
	}
	*mhandle = unsafe.Pointer(mh)
	return C.int(resSuccess)
}

//export mpibGoDeregMr
func mpibGoDeregMr(comm unsafe.Pointer, mhandle unsafe.Pointer) (rc C.int) {
	defer recoverEntry("deregMr", &rc)
	if C.mpib_dereg_mr((*C.struct_mpib_mr)(mhandle)) != 0 {
		warnf("deregMr failed")
		return C.int(resSystemError)
	}
	return C.int(resSuccess)
}

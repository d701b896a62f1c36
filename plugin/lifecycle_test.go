package main

import "testing"

// TestFinalizeOfAnUnknownContext: NCCL 2.28.3 finalizes a communicator whose init failed (no
// context of ours); that ends nothing and leaves the live contexts' count of the devices as it
// was, while a live context's finalize ends it and drops its count.
func TestFinalizeOfAnUnknownContext(t *testing.T) {
	plugin.mu.Lock()
	plugin.refs = 1
	plugin.mu.Unlock()
	id := newNetCtx(tcUndef)
	finalizeCtx(id + 1000)
	finalizeCtx(0)
	plugin.mu.Lock()
	refs := plugin.refs
	plugin.mu.Unlock()
	if refs != 1 || lookupCtx(id) == nil {
		t.Fatalf("after finalizes of unknown contexts: refs %d (want 1), context live %v (want true)", refs, lookupCtx(id) != nil)
	}
	finalizeCtx(id)
	plugin.mu.Lock()
	refs = plugin.refs
	plugin.mu.Unlock()
	if refs != 0 || lookupCtx(id) != nil {
		t.Fatalf("after the live context's finalize: refs %d (want 0), context live %v (want false)", refs, lookupCtx(id) != nil)
	}
}

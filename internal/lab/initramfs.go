package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// rootModules are what the initramfs loads to mount the root disk (the kernel has virtio
// and virtio_pci built in; their dependencies are resolved from modules.dep).
var rootModules = []string{"virtio_blk", "ext4"}

// buildInitramfs writes a busybox initramfs that loads rootModules and switches to the disk.
func buildInitramfs(ctx context.Context, k *kernel, dir, out string) error {
	for _, d := range []string{"bin", "dev", "proc", "sys", "newroot", "modules"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	base := filepath.Dir(filepath.Dir(filepath.Dir(k.ModulesDir))) // .../root (lib -> usr/lib)
	args := append([]string{"-d", base, "-S", k.Version, "--show-depends", "-a"}, rootModules...)
	deps, err := output(ctx, nil, "modprobe", args...)
	if err != nil {
		return err
	}
	var order []string
	seen := map[string]bool{}
	for _, l := range strings.Split(deps, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "insmod" || seen[f[1]] {
			continue
		}
		seen[f[1]] = true
		name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(f[1]), ".xz"), ".zst")
		if err := decompressModule(ctx, f[1], filepath.Join(dir, "modules", name)); err != nil {
			return err
		}
		order = append(order, name)
	}
	if len(order) == 0 {
		return fmt.Errorf("no modules resolved for %v", rootModules)
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.list"), []byte(strings.Join(order, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if err := copyFile(staticBusybox, filepath.Join(dir, "bin/busybox"), 0o755); err != nil {
		return err
	}
	init, err := guestFiles.ReadFile("guest/initramfs-init")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "init"), init, 0o755); err != nil {
		return err
	}
	script := fmt.Sprintf("cd %q && find . | cpio -o -H newc --quiet | gzip -1 > %q", dir, out)
	return run(ctx, nil, "sh", "-c", script)
}

// decompressModule writes a plain .ko: busybox insmod does not read compressed modules.
func decompressModule(ctx context.Context, src, dst string) error {
	var tool string
	switch {
	case strings.HasSuffix(src, ".xz"):
		tool = "xz"
	case strings.HasSuffix(src, ".zst"):
		tool = "zstd"
	default:
		return copyFile(src, dst, 0o644)
	}
	return run(ctx, nil, "sh", "-c", fmt.Sprintf("%s -dc %q > %q", tool, src, dst))
}

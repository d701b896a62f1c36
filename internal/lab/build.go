package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpib/mpib/containers"
)

// Image is a built lab VM image in the cache.
type Image struct {
	Dir      string
	Vmlinuz  string
	Initrd   string
	Disk     string // raw ext4 root disk; booted with -snapshot, never written after build
	Manifest Manifest
}

// Manifest records what a cached image was built from and how long that took.
type Manifest struct {
	Key              string    `json:"key"`
	KernelVersion    string    `json:"kernel_version"`     // uname -r in the guest
	KernelPkgVersion string    `json:"kernel_pkg_version"` // linux-image-amd64 version
	Suite            string    `json:"suite"`
	NodeImage        string    `json:"node_image"`
	BuiltAt          time.Time `json:"built_at"`
	BuildSeconds     float64   `json:"build_seconds"` // rootfs, kernel, initramfs, disk
	PrimeSeconds     float64   `json:"prime_seconds"` // first boot importing the node image
	NodeTarBytes     int64     `json:"node_tar_bytes"`
}

const manifestName = "manifest.json"

// imageDir is the cache directory of the current recipe.
func (c Config) imageDir() string { return filepath.Join(c.CacheDir, "images", Key()) }

// CachedImage returns the image of the current recipe if it is in the cache.
func CachedImage(cfg Config) (*Image, bool) {
	img := imageAt(cfg.imageDir())
	data, err := os.ReadFile(filepath.Join(img.Dir, manifestName))
	if err != nil || json.Unmarshal(data, &img.Manifest) != nil {
		return nil, false
	}
	return img, true
}

func imageAt(dir string) *Image {
	return &Image{Dir: dir, Vmlinuz: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"), Disk: filepath.Join(dir, "disk.img")}
}

// Build returns the cached VM image of the current recipe, building it when missing.
func Build(ctx context.Context, cfg Config) (*Image, error) {
	unlock, err := Lock(ctx, cfg, "vm")
	if err != nil {
		return nil, err
	}
	defer unlock()
	return build(ctx, cfg)
}

func build(ctx context.Context, cfg Config) (*Image, error) {
	if err := ensureQEMU(ctx, cfg); err != nil { // the prime boot and every later one
		return nil, err
	}
	if img, ok := CachedImage(cfg); ok {
		cfg.logf("image %s cached (kernel %s)", img.Dir, img.Manifest.KernelVersion)
		return img, nil
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("building the lab image needs root (debootstrap)")
	}
	if err := ensureHostTools(ctx, cfg, vmTools); err != nil {
		return nil, err
	}
	final := cfg.imageDir()
	work := final + ".build"
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	img, err := buildImage(ctx, cfg, work)
	if err != nil {
		return nil, fmt.Errorf("lab image build (work dir %s kept): %w", work, err)
	}
	for _, scratch := range []string{"rootfs", "node", "node.slim.sh", "kernel", "initramfs", "node.tar", "empty"} {
		_ = os.RemoveAll(filepath.Join(work, scratch))
	}
	_ = os.RemoveAll(final)
	if err := os.Rename(work, final); err != nil {
		return nil, err
	}
	img = imageAt(final)
	img.Manifest, _ = readManifest(final)
	pruneImages(cfg, img.Manifest.Key)
	return img, nil
}

// pruneImages removes the images of other recipes, except one a running VM was booted
// from (QEMU keeps its files open, but Down and Status still read its directory).
func pruneImages(cfg Config, keep string) {
	running := ""
	if data, err := os.ReadFile(cfg.statePath()); err == nil {
		var s State
		if json.Unmarshal(data, &s) == nil && qemuAlive(s.Pid) {
			running = s.Key
		}
	}
	dirs, _ := os.ReadDir(filepath.Join(cfg.CacheDir, "images"))
	for _, d := range dirs {
		if name := d.Name(); name != keep && name != running && !strings.HasSuffix(name, ".build") {
			cfg.logf("removing the image of an older recipe: %s", name)
			_ = os.RemoveAll(filepath.Join(cfg.CacheDir, "images", name))
		}
	}
}

func readManifest(dir string) (Manifest, error) {
	var m Manifest
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err == nil {
		err = json.Unmarshal(data, &m)
	}
	return m, err
}

func buildImage(ctx context.Context, cfg Config, work string) (*Image, error) {
	start := time.Now()
	mirror := mirror()
	// Package caches shared by all recipes (saves downloads on rebuilds); one per rootfs,
	// since concurrent debootstraps on one cache directory race.
	debCache := filepath.Join(cfg.CacheDir, "debs")
	for _, d := range []string{"guest", "node"} {
		if err := os.MkdirAll(filepath.Join(debCache, d), 0o755); err != nil {
			return nil, err
		}
	}
	cfg.logf("building image %s in %s (kernel from %s, userspace %s)", Key(), work, kernelSuite, suite)
	var k *kernel
	var nodeBytes int64
	err := parallel(
		func() (err error) {
			k, err = fetchKernel(ctx, filepath.Join(work, "kernel"), mirror)
			if err == nil {
				cfg.logf("kernel %s (%s %s)", k.Version, kernelPkg, k.PkgVersion)
			}
			return err
		},
		func() error {
			t := time.Now()
			if err := debootstrap(ctx, filepath.Join(work, "rootfs"), filepath.Join(debCache, "guest"), mirror, guestPackages); err != nil {
				return fmt.Errorf("guest rootfs: %w", err)
			}
			cfg.logf("guest rootfs: %.0f s", time.Since(t).Seconds())
			return nil
		},
		func() (err error) {
			t := time.Now()
			nodeBytes, err = buildNodeTar(ctx, filepath.Join(work, "node"), filepath.Join(work, "node.tar"), filepath.Join(debCache, "node"), mirror)
			if err != nil {
				return fmt.Errorf("node rootfs: %w", err)
			}
			cfg.logf("node rootfs: %.0f s, %d MiB tar", time.Since(t).Seconds(), nodeBytes>>20)
			return nil
		},
	)
	if err != nil {
		return nil, err
	}
	img := imageAt(work)
	if err := copyFile(k.Vmlinuz, img.Vmlinuz, 0o644); err != nil {
		return nil, err
	}
	if err := buildInitramfs(ctx, k, filepath.Join(work, "initramfs"), img.Initrd); err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	rootfs := filepath.Join(work, "rootfs")
	if err := finishGuestRootfs(ctx, k, rootfs); err != nil {
		return nil, fmt.Errorf("guest rootfs: %w", err)
	}
	built := time.Since(start)
	cfg.logf("image parts ready: %.0f s; first boot imports the node image", built.Seconds())

	t := time.Now()
	var primeErr error
	for attempt := 1; attempt <= bootAttempts; attempt++ {
		if err := makeDisk(ctx, rootfs, img.Disk); err != nil {
			return nil, fmt.Errorf("disk: %w", err)
		}
		if primeErr = prime(ctx, cfg, img, work); primeErr == nil {
			break
		}
		cfg.logf("prime boot %d/%d failed: %v", attempt, bootAttempts, primeErr)
	}
	if primeErr != nil {
		return nil, primeErr
	}
	m := Manifest{
		Key: Key(), KernelVersion: k.Version, KernelPkgVersion: k.PkgVersion, Suite: suite,
		NodeImage: containers.NodeImage, BuiltAt: time.Now().UTC(),
		BuildSeconds: built.Seconds(), PrimeSeconds: time.Since(t).Seconds(), NodeTarBytes: nodeBytes,
	}
	data, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(filepath.Join(work, manifestName), append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	cfg.logf("image built: %.0f s (parts %.0f s, prime boot %.0f s)", built.Seconds()+m.PrimeSeconds, m.BuildSeconds, m.PrimeSeconds)
	return img, nil
}

func mirror() string {
	if m := os.Getenv("MPIB_LAB_MIRROR"); m != "" {
		return m
	}
	return defaultMirror
}

// debootstrap makes a minbase rootfs of the lab suite with the given packages.
func debootstrap(ctx context.Context, dir, debCache, mirror string, pkgs []string) error {
	return run(ctx, nil, "debootstrap", "--variant=minbase", "--include="+strings.Join(pkgs, ","),
		"--cache-dir="+debCache, suite, dir, mirror)
}

// buildNodeTar builds the node image rootfs (containers/node) and tars it for docker import.
func buildNodeTar(ctx context.Context, dir, tarPath, debCache, mirror string) (int64, error) {
	if err := debootstrap(ctx, dir, debCache, mirror, containers.NodePackages()); err != nil {
		return 0, err
	}
	slim, err := containers.Recipe.ReadFile("node/slim.sh")
	if err != nil {
		return 0, err
	}
	script := dir + ".slim.sh"
	if err := os.WriteFile(script, slim, 0o755); err != nil {
		return 0, err
	}
	if err := run(ctx, nil, "sh", script, dir); err != nil {
		return 0, err
	}
	if err := run(ctx, nil, "tar", "--numeric-owner", "-C", dir, "-cf", tarPath, "."); err != nil {
		return 0, err
	}
	st, err := os.Stat(tarPath)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// finishGuestRootfs adds the kernel's modules and the lab's init to the guest rootfs.
func finishGuestRootfs(ctx context.Context, k *kernel, rootfs string) error {
	modules := filepath.Join(rootfs, "usr/lib/modules")
	if err := os.MkdirAll(modules, 0o755); err != nil {
		return err
	}
	if err := run(ctx, nil, "cp", "-a", k.ModulesDir, modules+"/"); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(modules, k.Version, "vmlinuz"))
	if err := run(ctx, nil, "depmod", "-b", rootfs, k.Version); err != nil {
		return err
	}
	init, err := guestFiles.ReadFile("guest/init")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(rootfs, "sbin/mpib-init"), init, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"etc/hostname": "mpib-lab\n",
		"etc/hosts":    "127.0.0.1 localhost mpib-lab\n::1 localhost\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(rootfs, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for _, d := range []string{"usr/share/doc", "usr/share/man", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists"} {
		_ = os.RemoveAll(filepath.Join(rootfs, d))
	}
	return nil
}

// makeDisk writes the guest rootfs into a fresh raw ext4 image with room for Docker's data.
func makeDisk(ctx context.Context, rootfs, disk string) error {
	var used int64
	_ = filepath.WalkDir(rootfs, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				used += info.Size()
			}
		}
		return nil
	})
	sizeMiB := used>>20 + 3072 // the imported node image and the containers' layers
	_ = os.Remove(disk)
	return run(ctx, nil, "mkfs.ext4", "-q", "-F", "-L", "mpiblab", "-d", rootfs, disk, strconv.FormatInt(sizeMiB, 10)+"M")
}

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, mode)
}

// parallel runs fns concurrently and returns the first error.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

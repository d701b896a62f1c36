package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// kernel is an unpacked Debian kernel: its image and its module tree.
type kernel struct {
	Version    string // uname -r, e.g. 7.3.4+deb13-amd64
	PkgVersion string // Debian package version of linux-image-amd64
	Vmlinuz    string
	ModulesDir string // .../lib/modules/<Version>
}

// fetchKernel downloads whatever linux-image-amd64 the kernel suite has now (backports keep
// only the newest) through a private apt configuration, leaving the host's apt state alone,
// and unpacks it under dir.
func fetchKernel(ctx context.Context, dir, mirror string) (*kernel, error) {
	aptDir := filepath.Join(dir, "apt")
	for _, d := range []string{"lists/partial", "cache/archives/partial", "debs"} {
		if err := os.MkdirAll(filepath.Join(aptDir, d), 0o755); err != nil {
			return nil, err
		}
	}
	sources := filepath.Join(aptDir, "sources.list")
	line := fmt.Sprintf("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n", mirror, kernelSuite)
	if err := os.WriteFile(sources, []byte(line), 0o644); err != nil {
		return nil, err
	}
	opts := []string{
		"-o", "Dir::Etc::SourceList=" + sources,
		"-o", "Dir::Etc::SourceParts=/dev/null",
		"-o", "Dir::State::Lists=" + filepath.Join(aptDir, "lists"),
		"-o", "Dir::Cache=" + filepath.Join(aptDir, "cache"),
		"-o", "Dir::State::Status=/dev/null",
		"-o", "APT::Architecture=amd64",
		"-o", "APT::Sandbox::User=root",
		"-qq",
	}
	apt := func(tool string, args ...string) (string, error) {
		return output(ctx, nil, tool, append(append([]string{}, opts...), args...)...)
	}
	if _, err := apt("apt-get", "update"); err != nil {
		return nil, fmt.Errorf("kernel package index: %w", err)
	}
	deps, err := apt("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
		"--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", kernelPkg)
	if err != nil {
		return nil, err
	}
	// The closure holds the meta packages, the kernel image and its modules, plus the
	// initramfs tools and kmod that we do not want; keep the linux-* packages.
	var pkgs []string
	for _, l := range strings.Split(deps, "\n") {
		if strings.HasPrefix(l, "linux-") {
			pkgs = append(pkgs, strings.TrimSpace(l))
		}
	}
	show, err := apt("apt-cache", "show", "--no-all-versions", kernelPkg)
	if err != nil {
		return nil, err
	}
	k := &kernel{PkgVersion: field(show, "Version")}
	debs := filepath.Join(aptDir, "debs")
	cmd := append(append([]string{}, opts...), append([]string{"download"}, pkgs...)...)
	if err := runIn(ctx, debs, "apt-get", cmd...); err != nil {
		return nil, fmt.Errorf("kernel download: %w", err)
	}
	root := filepath.Join(dir, "root")
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	for _, f := range files {
		if err := run(ctx, nil, "dpkg-deb", "-x", f, root); err != nil {
			return nil, err
		}
	}
	images, _ := filepath.Glob(filepath.Join(root, "usr/lib/modules/*/vmlinuz"))
	images2, _ := filepath.Glob(filepath.Join(root, "boot/vmlinuz-*"))
	images = append(images, images2...)
	if len(images) != 1 {
		return nil, fmt.Errorf("kernel packages %v: want one vmlinuz, found %v", pkgs, images)
	}
	k.Vmlinuz = images[0]
	mods, _ := filepath.Glob(filepath.Join(root, "usr/lib/modules/*/modules.order"))
	if len(mods) != 1 {
		return nil, fmt.Errorf("kernel packages %v: want one module tree, found %v", pkgs, mods)
	}
	k.ModulesDir = filepath.Dir(mods[0])
	k.Version = filepath.Base(k.ModulesDir)
	// Merged /usr: depmod and modprobe -d look under <base>/lib/modules.
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil && !os.IsExist(err) {
		return nil, err
	}
	if err := run(ctx, nil, "depmod", "-b", root, k.Version); err != nil {
		return nil, err
	}
	return k, nil
}

// field returns the value of a deb822 field in the first stanza of text.
func field(text, name string) string {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+": "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

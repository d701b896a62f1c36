package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// hostTool is a command a build needs and the Debian package that provides it. A tool
// without cmd is checked by its package being installed.
type hostTool struct{ cmd, pkg string }

// nodeTools build the node image; vmTools also the VM image.
var nodeTools = []hostTool{{"debootstrap", "debootstrap"}, {"tar", "tar"}}

// QEMU is not among them: ensureQEMU, which runs first, installs it at its minimum version.
var vmTools = []hostTool{
	{"debootstrap", "debootstrap"},
	{"cpio", "cpio"},
	{"mkfs.ext4", "e2fsprogs"},
	{"depmod", "kmod"},
	{"xz", "xz-utils"},
	{"zstd", "zstd"},
	{"apt-get", "apt"},
	{"dpkg-deb", "dpkg"},
	{"", "busybox-static"}, // the initramfs needs a static busybox (Debian's busybox is not)
}

// staticBusybox is where Debian's busybox-static puts its binary.
const staticBusybox = "/bin/busybox"

// ensureHostTools installs the missing build tools with apt-get when running as root, and
// otherwise names them in the error.
func ensureHostTools(ctx context.Context, cfg Config, tools []hostTool) error {
	var missing []string
	for _, t := range tools {
		if t.cmd == "" {
			out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", t.pkg).Output()
			if err != nil || !strings.Contains(string(out), "install ok installed") {
				missing = append(missing, t.pkg)
			}
		} else if _, err := exec.LookPath(t.cmd); err != nil {
			missing = append(missing, t.pkg)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("lab build needs these Debian packages: %s (run as root to install them automatically)",
			strings.Join(missing, " "))
	}
	cfg.logf("installing host tools: %s", strings.Join(missing, " "))
	if err := aptUpdate(ctx); err != nil {
		return err
	}
	return aptInstall(ctx, "", missing...)
}

var aptEnv = []string{"DEBIAN_FRONTEND=noninteractive"}

// aptUpdate reads the package indexes of every configured source.
func aptUpdate(ctx context.Context) error { return run(ctx, aptEnv, "apt-get", "update", "-qq") }

// aptInstall installs pkgs without their recommendations, from release (apt-get -t) when it
// is not "".
func aptInstall(ctx context.Context, release string, pkgs ...string) error {
	args := []string{"install", "-y", "-qq", "--no-install-recommends"}
	if release != "" {
		args = append(args, "-t", release)
	}
	return run(ctx, aptEnv, "apt-get", append(args, pkgs...)...)
}

package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// The lab runs its VM under QEMU's TCG, and what it measures (connection setup above all) is
// CPU time in that VM. QEMU before 8.0 keys each translated block of x86 code by its virtual
// address. Every process maps its libraries at an address of its own (ASLR), so a new process
// translates again every code path it runs for the first time: in the lab, a fresh
// process's first 4 + 4 connections took 0.38-0.57 s on QEMU 7.2 (its second 4 + 4, 0.22-0.40
// s), and 0.22-0.29 s with ASLR off once an earlier process had run at the same addresses.
// From 8.0 a block is keyed by its physical page (CF_PCREL), so every process that maps the
// same library page reuses it, and a real CPU needs no translation at all: 0.20-0.34 s for
// the first 4 + 4 on QEMU 10.0 (docs/benchmarks.md, "The first round and QEMU").
// Debian bookworm ships 7.2, and its backports 10.0.
var minQEMU = qemuVersion{8, 0}

// qemuVersion is QEMU's major and minor version.
type qemuVersion struct{ major, minor int }

func (v qemuVersion) atLeast(w qemuVersion) bool {
	return v.major > w.major || v.major == w.major && v.minor >= w.minor
}

func (v qemuVersion) String() string { return fmt.Sprintf("%d.%d", v.major, v.minor) }

var qemuVersionLine = regexp.MustCompile(`QEMU emulator version (\d+)\.(\d+)`)

// parseQEMUVersion reads the version from `qemu-system-x86_64 --version`'s output.
func parseQEMUVersion(out string) (qemuVersion, bool) {
	m := qemuVersionLine.FindStringSubmatch(out)
	if m == nil {
		return qemuVersion{}, false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return qemuVersion{major, minor}, true
}

// installedQEMU is the version of the qemu-system-x86_64 on PATH (false: none, or no
// version line).
func installedQEMU(ctx context.Context) (qemuVersion, bool) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return qemuVersion{}, false
	}
	out, err := output(ctx, nil, "qemu-system-x86_64", "--version")
	if err != nil {
		return qemuVersion{}, false
	}
	return parseQEMUVersion(out)
}

// osCodename is VERSION_CODENAME from an os-release file's text ("" when it has none).
func osCodename(osRelease string) string {
	for _, l := range strings.Split(osRelease, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "VERSION_CODENAME="); ok {
			return strings.Trim(v, `"'`)
		}
	}
	return ""
}

// backportsSourcesFile is the apt source the lab adds for QEMU from the host release's
// backports. Backports are pinned below the release (apt's default), so only what is
// installed with -t from them comes from them.
const backportsSourcesFile = "/etc/apt/sources.list.d/mpib-lab-backports.list"

// ensureQEMU makes sure the VM runs under a QEMU of at least minQEMU. As root it installs
// qemu-system-x86 with apt from the host release's backports (which fall back to the release
// itself for a release whose own QEMU is new enough), or from the release when its backports
// cannot be had; without root, or when no newer QEMU can be had, an older QEMU that is
// present is used with a warning: the lab works, but each new process in it pays for
// translating its code again.
func ensureQEMU(ctx context.Context, cfg Config) error {
	if v, ok := installedQEMU(ctx); ok && v.atLeast(minQEMU) {
		return nil
	}
	if os.Geteuid() == 0 {
		if err := installQEMU(ctx, cfg); err != nil {
			cfg.logf("installing QEMU >= %v: %v", minQEMU, err)
			if _, ok := installedQEMU(ctx); !ok { // the release's own, then, rather than none
				if err := ensureHostTools(ctx, cfg, []hostTool{{"qemu-system-x86_64", "qemu-system-x86"}}); err != nil {
					return err
				}
			}
		}
	}
	v, ok := installedQEMU(ctx)
	switch {
	case !ok:
		return fmt.Errorf("the lab needs qemu-system-x86_64 >= %v (Debian package qemu-system-x86; run as root to install it automatically)", minQEMU)
	case !v.atLeast(minQEMU):
		cfg.logf("warning: QEMU %v translates code again in every process (it keys translations by virtual address): connection setup reads up to twice as slow in the lab; install QEMU >= %v", v, minQEMU)
	}
	return nil
}

// installQEMU installs qemu-system-x86 from the host release's backports.
func installQEMU(ctx context.Context, cfg Config) error {
	osRelease, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return err
	}
	codename := osCodename(string(osRelease))
	if codename == "" {
		return fmt.Errorf("/etc/os-release names no VERSION_CODENAME: no backports to install from")
	}
	line := fmt.Sprintf("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s-backports main\n", mirror(), codename)
	if err := os.WriteFile(backportsSourcesFile, []byte(line), 0o644); err != nil {
		return err
	}
	if err := aptUpdate(ctx); err != nil {
		os.Remove(backportsSourcesFile) // a release without backports: leave apt as it was
		return err
	}
	cfg.logf("installing qemu-system-x86 from %s-backports (QEMU >= %v)", codename, minQEMU)
	return aptInstall(ctx, codename+"-backports", "qemu-system-x86")
}

package dist

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// DebLibDir is where the .deb installs the plugin: the multiarch library folder of Debian and
// Ubuntu, on the loader's default path, where NCCL's dlopen("libnccl-net-NAME.so") finds it
// (NCCL_NET_PLUGIN=mpib).
const DebLibDir = "usr/lib/x86_64-linux-gnu"

// debPackage is the .deb's name; its file is debPackage_VERSION_amd64.deb.
const debPackage = "libnccl-net-mpib"

// buildDeb stages the plugin and its deployment docs under a DEBIAN/control and builds the
// .deb with dpkg-deb into the stage's deb/. It returns the .deb's path.
func buildDeb(c Config, env []string, rel Release, stage string) (string, error) {
	debVersion, err := DebVersion(rel.Version)
	if err != nil {
		return "", err
	}
	root := filepath.Join(c.Out, "deb-root")
	defer os.RemoveAll(root)
	so := filepath.Join(stage, "lib", "libnccl-net-mpib.so")
	docDir := filepath.Join(root, "usr", "share", "doc", debPackage)
	for _, f := range []struct{ src, dst string }{
		{so, filepath.Join(root, DebLibDir, "libnccl-net-mpib.so")},
		{filepath.Join(c.Root, "docs", "deploying.md"), filepath.Join(docDir, "deploying.md")},
		{filepath.Join(c.Root, "docs", "nccl-loading.md"), filepath.Join(docDir, "nccl-loading.md")},
	} {
		if err := copyFile(f.src, f.dst, 0o644); err != nil {
			return "", err
		}
	}
	st, err := os.Stat(so)
	if err != nil {
		return "", err
	}
	control, err := Control(Package{
		Name: debPackage, Version: debVersion, Architecture: "amd64", MultiArchSame: true,
		Maintainer: "MPIB maintainers <mpib@localhost>", Section: "libs",
		Depends:      "libc6 (>= 2.28), libibverbs1",
		InstalledKiB: (st.Size() + 1023) / 1024,
		Summary:      "MPIB: multi-path InfiniBand/RoCE network plugin for NCCL",
		Description: "Splits each NCCL connection over a scale-out NIC and a direct-attach NIC.\n" +
			"Load it with NCCL_NET_PLUGIN=mpib; commit " + rel.Commit + ".",
	})
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(root, "DEBIAN"), 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(root, "DEBIAN", "control"), []byte(control), 0o644); err != nil {
		return "", err
	}
	if err := chmodDirs(root); err != nil {
		return "", err
	}
	deb := filepath.Join(stage, "deb", fmt.Sprintf("%s_%s_amd64.deb", debPackage, debVersion))
	if err := run(c.Log, "", env, "dpkg-deb", "--root-owner-group", "-Zxz", "--build", root, deb); err != nil {
		return "", fmt.Errorf("%w (dpkg-deb comes with Debian's dpkg package)", err)
	}
	return deb, nil
}

// chmodDirs makes every folder under root 0755 (dpkg-deb refuses group-writable DEBIAN).
func chmodDirs(root string) error {
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return os.Chmod(p, 0o755)
	})
}

// pack writes the stage's SHA256SUMS, the tarball, and beside it a copy of the .deb and a
// SHA256SUMS of both.
func pack(c Config, stage, name string, mtime time.Time, rel *Release) error {
	sums, err := Sums(os.DirFS(stage))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(stage, SumsFile), sums, 0o644); err != nil {
		return err
	}
	rel.Tarball = filepath.Join(c.Out, name+".tar.gz")
	if err := WriteTarGz(rel.Tarball, stage, name, mtime); err != nil {
		return err
	}
	deb := filepath.Join(c.Out, filepath.Base(rel.Deb))
	if err := copyFile(rel.Deb, deb, 0o644); err != nil {
		return err
	}
	rel.Deb = deb
	if err := os.RemoveAll(stage); err != nil {
		return err
	}
	outer, err := Sums(os.DirFS(c.Out))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Out, SumsFile), outer, 0o644)
}

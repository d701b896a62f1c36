package lab

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"sort"

	"github.com/mpib/mpib/containers"
)

// recipeVersion is part of the cache key: bump it when the build steps in this package
// change in a way that changes the image.
const recipeVersion = "lab-recipe-1"

//go:embed guest
var guestFiles embed.FS

// guestPackages go into the guest rootfs (bookworm minbase) next to the kernel's modules.
var guestPackages = []string{
	"rdma-core", "ibverbs-providers", "libibverbs1", "ibverbs-utils", "perftest",
	"iproute2", "kmod", "procps", "iputils-ping", "ethtool", "docker.io", "iptables",
}

const (
	suite         = "bookworm"         // guest and node userspace: the build host's release
	kernelSuite   = "trixie-backports" // kernel with rxe across network namespaces
	kernelPkg     = "linux-image-amd64"
	defaultMirror = "http://deb.debian.org/debian"
)

// Key is the recipe hash naming the cache directory of the image.
func Key() string {
	h := sha256.New()
	h.Write([]byte(recipeVersion + "\x00" + suite + "\x00" + kernelSuite + "\x00"))
	for _, p := range guestPackages {
		h.Write([]byte(p + "\x00"))
	}
	hashFS(h, guestFiles)
	hashFS(h, containers.Recipe)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func hashFS(h interface{ Write([]byte) (int, error) }, fsys fs.FS) {
	var names []string
	_ = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	sort.Strings(names)
	for _, n := range names {
		data, _ := fs.ReadFile(fsys, n)
		h.Write([]byte(n + "\x00"))
		h.Write(data)
		h.Write([]byte{0})
	}
}

// Package lab builds and runs the soft-RoCE lab: a Docker engine whose kernel has rdma_rxe
// (soft-RoCE) and the node image the integration harness starts its containers from.
//
// On a host whose kernel has rdma_rxe and that runs a Docker engine, the lab is the host
// itself. Anywhere else it is a QEMU guest (TCG, or KVM when it really works) booted from an
// image built from Debian packages only: a trixie-backports kernel (bookworm's 6.1 cannot
// do rxe across network namespaces) and a bookworm userspace, the same as the build host's,
// so binaries built on the host run in the nodes. The guest's Docker API is forwarded to
// 127.0.0.1 on the host and the repository's build/ directory is shared into the guest.
//
// Built images are cached outside the repository, under Config.CacheDir, in a directory
// named by a hash of the recipe (the embedded guest scripts and the node image recipe).
package lab

import (
	"errors"
	"io"
	"os"
	"path/filepath"
)

// Config says where the lab keeps its files and what it shares with the nodes.
type Config struct {
	// CacheDir holds built images (one directory per recipe hash) and the running lab's
	// state. Default: $MPIB_LAB_CACHE, else $HOME/.cache/mpib-lab.
	CacheDir string
	// BuildDir is the host directory the nodes see read-only at /opt/mpib.
	BuildDir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// DockerPort is the host port a booted VM's Docker API should get when it is free (0: any
	// free port). A harness that reboots the lab passes the old one: testcontainers-go reads
	// DOCKER_HOST once per process, so a new port would be unreachable from it.
	DockerPort int
}

// Env is what a harness needs to use a running lab.
type Env struct {
	Mode       string // ModeVM or ModeHost
	DockerHost string // DOCKER_HOST value for the lab's engine ("" = the host's default)
	Image      string // node image tag, present in the engine
	// BuildDir is the path of the shared build directory on the engine's machine: what the
	// nodes see at /opt/mpib (the harness binds a copy of it in the VM: 9p keeps no page cache).
	BuildDir string
	// Owned is true when this process booted the lab, so it should also stop it.
	Owned bool
}

// Lab modes.
const (
	ModeVM   = "vm"   // QEMU guest built by this package
	ModeHost = "host" // the host's own kernel and Docker engine
)

// ErrNotRunning is returned by Down and Status when no lab is up.
var ErrNotRunning = errors.New("lab is not running")

// DefaultConfig returns the configuration for the repository at repoRoot.
func DefaultConfig(repoRoot string) Config {
	cache := os.Getenv("MPIB_LAB_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache", "mpib-lab")
	}
	return Config{CacheDir: cache, BuildDir: filepath.Join(repoRoot, "build")}
}

// FindRepoRoot walks up from dir to the directory holding go.mod.
func FindRepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

func (c Config) logf(format string, args ...any) {
	if c.Log != nil {
		fprintf(c.Log, "lab: "+format+"\n", args...)
	}
}

package lab

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/mpib/mpib/containers"
)

// hostLab returns the host itself as the lab when its kernel has rdma_rxe and a Docker
// engine answers (DOCKER_HOST or the default socket). MPIB_LAB_MODE=vm forces the VM,
// MPIB_LAB_MODE=host forces the host (and fails clearly when it lacks something).
//
// On the host the node image is built with the same recipe and imported with `docker
// import` when missing. The host's RDMA netns mode is left as it is: the harness works in
// both modes (see docs/lab.md).
func hostLab(ctx context.Context, cfg Config) (*Env, bool, error) {
	switch os.Getenv("MPIB_LAB_MODE") {
	case ModeVM:
		return nil, false, nil
	case ModeHost:
	default:
		if !hostHasRxe(ctx) || run(ctx, nil, "docker", "info") != nil {
			return nil, false, nil
		}
	}
	_ = run(ctx, nil, "modprobe", "rdma_rxe")
	if err := run(ctx, nil, "docker", "image", "inspect", containers.NodeImage); err != nil {
		if err := importNodeImage(ctx, cfg); err != nil {
			return nil, true, err
		}
	}
	if err := os.MkdirAll(cfg.BuildDir, 0o755); err != nil {
		return nil, true, err
	}
	cfg.logf("using the host kernel's rdma_rxe and Docker engine (no VM)")
	return &Env{Mode: ModeHost, DockerHost: os.Getenv("DOCKER_HOST"), Image: containers.NodeImage, BuildDir: cfg.BuildDir}, true, nil
}

func hostHasRxe(ctx context.Context) bool {
	if _, err := os.Stat("/sys/module/rdma_rxe"); err == nil {
		return true
	}
	return exec.CommandContext(ctx, "modprobe", "-n", "-q", "rdma_rxe").Run() == nil
}

// importNodeImage builds the node rootfs with the lab recipe and imports it into the host's
// Docker engine.
func importNodeImage(ctx context.Context, cfg Config) error {
	if err := ensureHostTools(ctx, cfg, nodeTools); err != nil {
		return err
	}
	work := filepath.Join(cfg.CacheDir, "host-node.build")
	_ = os.RemoveAll(work)
	defer os.RemoveAll(work)
	debCache := filepath.Join(cfg.CacheDir, "debs", "node")
	if err := os.MkdirAll(debCache, 0o755); err != nil {
		return err
	}
	tar := filepath.Join(work, "node.tar")
	if _, err := buildNodeTar(ctx, filepath.Join(work, "node"), tar, debCache, mirror()); err != nil {
		return err
	}
	cfg.logf("importing %s into the host's Docker", containers.NodeImage)
	return run(ctx, nil, "docker", "import", tar, containers.NodeImage)
}

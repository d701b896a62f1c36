//go:build mage

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/magefile/mage/mg"

	"github.com/mpib/mpib/internal/lab"
)

// Lab groups the soft-RoCE lab targets (docs/lab.md).
type Lab mg.Namespace

// labConfig is the lab configuration of this checkout ($MPIB_LAB_CACHE overrides the cache).
func labConfig() (lab.Config, error) {
	root, err := os.Getwd()
	if err != nil {
		return lab.Config{}, err
	}
	cfg := lab.DefaultConfig(root)
	cfg.Log = os.Stderr
	return cfg, nil
}

// Build builds the lab VM image (kernel, initramfs, disk with the node image) unless cached.
func (Lab) Build(ctx context.Context) error {
	cfg, err := labConfig()
	if err != nil {
		return err
	}
	start := time.Now()
	img, err := lab.Build(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("lab image %s (kernel %s) ready in %.0f s\n", img.Dir, img.Manifest.KernelVersion, time.Since(start).Seconds())
	return nil
}

// Up boots the lab VM in the background (building it first if needed) and prints DOCKER_HOST.
func (Lab) Up(ctx context.Context) error {
	cfg, err := labConfig()
	if err != nil {
		return err
	}
	env, err := lab.Up(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("lab up (%s): DOCKER_HOST=%s image=%s\n", env.Mode, env.DockerHost, env.Image)
	return nil
}

// Down powers the lab VM off.
func (Lab) Down(ctx context.Context) error {
	cfg, err := labConfig()
	if err != nil {
		return err
	}
	if err := lab.Down(ctx, cfg); errors.Is(err, lab.ErrNotRunning) {
		fmt.Println("lab is not running")
		return nil
	} else if err != nil {
		return err
	}
	fmt.Println("lab down")
	return nil
}

// Status says whether the lab VM runs, with its DOCKER_HOST and kernel.
func (Lab) Status(ctx context.Context) error {
	cfg, err := labConfig()
	if err != nil {
		return err
	}
	s, err := lab.Status(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("lab VM pid %d up since %s: DOCKER_HOST=%s kernel=%s build=%s\n",
		s.Pid, s.StartedAt.Format(time.RFC3339), s.DockerHost, s.Kernel, s.BuildDir)
	return nil
}

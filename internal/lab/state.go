package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mpib/mpib/containers"
)

// State is the running lab VM, recorded in <CacheDir>/run/state.json so that `lab:down`,
// `lab:status` and test processes find it.
type State struct {
	Pid        int       `json:"pid"`
	DockerHost string    `json:"docker_host"`
	Key        string    `json:"key"`
	Kernel     string    `json:"kernel"`
	BuildDir   string    `json:"build_dir"` // host directory shared into the guest
	Console    string    `json:"console"`
	StartedAt  time.Time `json:"started_at"`
	BootSecs   float64   `json:"boot_seconds"` // QEMU start to Docker API reachable
}

func (c Config) runDir() string    { return filepath.Join(c.CacheDir, "run") }
func (c Config) statePath() string { return filepath.Join(c.runDir(), "state.json") }
func (c Config) ctlDir() string    { return filepath.Join(c.runDir(), "ctl") }

// guestBuildDir is where guest/init mounts the shared build directory.
const guestBuildDir = "/mnt/build"

// Status returns the running VM's state, or ErrNotRunning.
func Status(ctx context.Context, cfg Config) (*State, error) {
	data, err := os.ReadFile(cfg.statePath())
	if err != nil {
		return nil, ErrNotRunning
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.statePath(), err)
	}
	if !qemuAlive(s.Pid) {
		return &s, fmt.Errorf("%w (pid %d recorded in %s is gone)", ErrNotRunning, s.Pid, cfg.statePath())
	}
	if err := pingDocker(ctx, strings.TrimPrefix(s.DockerHost, "tcp://"), 5*time.Second); err != nil {
		return &s, fmt.Errorf("lab VM pid %d is up but its Docker API is not: %w", s.Pid, err)
	}
	return &s, nil
}

// Up makes a lab available: an already running VM, the host itself when its kernel has
// rdma_rxe and it runs a Docker engine, or a freshly booted VM (building the image first
// when the cache lacks it). The VM keeps running after Up returns; Down stops it.
func Up(ctx context.Context, cfg Config) (*Env, error) {
	unlock, err := Lock(ctx, cfg, "vm")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if s, err := Status(ctx, cfg); err == nil {
		if s.BuildDir != cfg.BuildDir {
			cfg.logf("warning: the running lab shares %s, not %s", s.BuildDir, cfg.BuildDir)
		}
		cfg.logf("using running lab VM (pid %d, %s)", s.Pid, s.DockerHost)
		return &Env{Mode: ModeVM, DockerHost: s.DockerHost, Image: containers.NodeImage, BuildDir: guestBuildDir}, nil
	} else if !errors.Is(err, ErrNotRunning) {
		// A VM whose Docker stopped answering (a hung guest) is replaced.
		cfg.logf("replacing the running lab: %v", err)
		if err := down(ctx, cfg); err != nil {
			return nil, err
		}
	}
	if env, ok, err := hostLab(ctx, cfg); ok || err != nil {
		return env, err
	}
	img, err := build(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s, err := boot(ctx, cfg, img)
	if err != nil {
		return nil, err
	}
	return &Env{Mode: ModeVM, DockerHost: s.DockerHost, Image: containers.NodeImage, BuildDir: guestBuildDir, Owned: true}, nil
}

// boot starts the VM, retrying boots that do not reach readiness.
func boot(ctx context.Context, cfg Config, img *Image) (*State, error) {
	if err := os.MkdirAll(cfg.BuildDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(cfg.runDir()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.ctlDir(), 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 1; attempt <= bootAttempts; attempt++ {
		port, err := freePort(cfg.DockerPort)
		if err != nil {
			return nil, err
		}
		spec := vmSpec{img: img, mode: "run", snapshot: true, buildDir: cfg.BuildDir, ctlDir: cfg.ctlDir(),
			port: port, console: filepath.Join(cfg.runDir(), "console.log")}
		start := time.Now()
		v, err := startVM(spec)
		if err != nil {
			return nil, err
		}
		hostport := "127.0.0.1:" + strconv.Itoa(port)
		err = waitConsole(ctx, v, spec.console, "MPIB-LAB-READY", readyTimeout)
		if err == nil {
			err = pingDocker(ctx, hostport, 20*time.Second)
		}
		if err != nil {
			v.kill()
			lastErr = err
			cfg.logf("boot %d/%d failed: %v", attempt, bootAttempts, err)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			continue
		}
		s := &State{Pid: v.cmd.Process.Pid, DockerHost: "tcp://" + hostport, Key: img.Manifest.Key,
			Kernel: img.Manifest.KernelVersion, BuildDir: cfg.BuildDir, Console: spec.console,
			StartedAt: start, BootSecs: time.Since(start).Seconds()}
		data, _ := json.MarshalIndent(s, "", "  ")
		if err := os.WriteFile(cfg.statePath(), append(data, '\n'), 0o644); err != nil {
			v.kill()
			return nil, err
		}
		cfg.logf("lab VM up in %.1f s (pid %d, DOCKER_HOST=%s, kernel %s)", s.BootSecs, s.Pid, s.DockerHost, s.Kernel)
		return s, nil
	}
	return nil, fmt.Errorf("lab VM did not boot in %d attempts: %w", bootAttempts, lastErr)
}

// Down powers the lab VM off: the guest stops dockerd and powers off when the control
// file appears; QEMU is killed if it has not exited within 60 s.
func Down(ctx context.Context, cfg Config) error {
	unlock, err := Lock(ctx, cfg, "vm")
	if err != nil {
		return err
	}
	defer unlock()
	return down(ctx, cfg)
}

func down(ctx context.Context, cfg Config) error {
	data, err := os.ReadFile(cfg.statePath())
	if err != nil {
		return ErrNotRunning
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	defer os.Remove(cfg.statePath())
	if !qemuAlive(s.Pid) {
		return nil
	}
	start := time.Now()
	if err := os.WriteFile(filepath.Join(cfg.ctlDir(), "poweroff"), nil, 0o644); err != nil {
		return err
	}
	for time.Since(start) < 60*time.Second && ctx.Err() == nil {
		if !qemuAlive(s.Pid) {
			cfg.logf("lab VM powered off in %.1f s", time.Since(start).Seconds())
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	cfg.logf("lab VM did not power off: killing pid %d", s.Pid)
	return syscall.Kill(s.Pid, syscall.SIGKILL)
}

// qemuAlive reports whether pid is a live (not zombie) QEMU process.
func qemuAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// Field 3, after "(comm)", is the state; Z is a zombie waiting for its parent.
	if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Contains(string(cmdline), "qemu-system")
}

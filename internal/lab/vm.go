package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mpib/mpib/containers"
)

// bootAttempts bounds the boots tried before giving up. Multi-threaded TCG panics early in
// about 1 boot in 24 (and 1 run in 10 later, at container start): a boot that does not
// reach readiness is a failed boot and is retried.
const bootAttempts = 3

const (
	readyTimeout = 4 * time.Minute
	primeTimeout = 8 * time.Minute
	guestMemMiB  = 4096
)

// vmSpec is one boot of the lab guest.
type vmSpec struct {
	img      *Image
	mode     string // "run" or "prime" (guest/init)
	snapshot bool   // leave the disk untouched
	buildDir string // shared read-only as tag "build"
	ctlDir   string // shared read-write as tag "ctl"
	port     int    // host port forwarded to the guest's dockerd (run mode)
	console  string // serial console log file
}

// vm is a running QEMU process.
type vm struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when QEMU exits
	err  error         // QEMU's exit status, valid after done
}

func accel() string {
	if a := os.Getenv("MPIB_LAB_ACCEL"); a != "" {
		return a // e.g. "kvm" where /dev/kvm really works (here it hangs)
	}
	return "tcg,thread=multi"
}

func startVM(s vmSpec) (*vm, error) {
	drive := "file=" + s.img.Disk + ",if=virtio,format=raw"
	if s.snapshot {
		drive += ",snapshot=on,cache=unsafe"
	}
	netdev := "user,id=n0,net=192.168.76.0/24,host=192.168.76.2"
	if s.port != 0 {
		netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:2375", s.port)
	}
	cmdline := "console=ttyS0 quiet panic=-1 oops=panic mpib.mode=" + s.mode + " mpib.image=" + containers.NodeImage
	if extra := os.Getenv("MPIB_LAB_KERNEL_ARGS"); extra != "" {
		cmdline += " " + extra
	}
	cpu := "max"
	if c := os.Getenv("MPIB_LAB_CPU"); c != "" {
		cpu = c
	}
	args := []string{
		"-name", "mpib-lab", "-nodefaults", "-display", "none", "-no-reboot",
		"-accel", accel(), "-cpu", cpu, "-smp", "2", "-m", strconv.Itoa(guestMemMiB),
		"-kernel", s.img.Vmlinuz, "-initrd", s.img.Initrd, "-append", cmdline,
		"-drive", drive,
		"-virtfs", "local,path=" + s.buildDir + ",mount_tag=build,security_model=none,readonly=on,id=build",
		"-virtfs", "local,path=" + s.ctlDir + ",mount_tag=ctl,security_model=none,id=ctl",
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=n0",
		"-serial", "file:" + s.console,
	}
	_ = os.Remove(s.console)
	stderr, err := os.Create(s.console + ".qemu")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives `mage lab:up`
	if err := cmd.Start(); err != nil {
		stderr.Close()
		return nil, err
	}
	v := &vm{cmd: cmd, done: make(chan struct{})}
	go func() {
		v.err = cmd.Wait()
		stderr.Close()
		close(v.done)
	}()
	return v, nil
}

func (v *vm) kill() {
	_ = v.cmd.Process.Kill()
	<-v.done
}

// failureMarks in the console mean the boot is lost.
var failureMarks = []string{"Kernel panic", "MPIB-LAB-FAIL", "Oops:", "BUG:"}

// waitConsole waits until the console shows mark, failing early on a failure mark, on
// QEMU's exit (unless exitOK) or after timeout.
func waitConsole(ctx context.Context, v *vm, console, mark string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		data, _ := os.ReadFile(console)
		if bytes.Contains(data, []byte(mark)) {
			return nil
		}
		for _, f := range failureMarks {
			if bytes.Contains(data, []byte(f)) {
				return fmt.Errorf("guest failed (%q on console):\n%s", f, tail(data, 1500))
			}
		}
		select {
		case <-v.done:
			data, _ = os.ReadFile(console)
			if bytes.Contains(data, []byte(mark)) {
				return nil
			}
			q, _ := os.ReadFile(console + ".qemu")
			return fmt.Errorf("qemu exited (%v) before %q: %s\n%s", v.err, mark, strings.TrimSpace(string(q)), tail(data, 1500))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %q after %v:\n%s", mark, timeout, tail(data, 1500))
		}
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// prime boots the freshly made disk once, writable, to import the node image into the
// guest's Docker; later boots use -snapshot and find the image already there (a warm disk
// also skips dockerd's first-start work).
func prime(ctx context.Context, cfg Config, img *Image, work string) error {
	console := filepath.Join(work, "prime-console.log")
	empty := filepath.Join(work, "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		return err
	}
	v, err := startVM(vmSpec{img: img, mode: "prime", buildDir: empty, ctlDir: work, console: console})
	if err != nil {
		return err
	}
	if err := waitConsole(ctx, v, console, "MPIB-LAB-PRIMED", primeTimeout); err != nil {
		v.kill()
		return err
	}
	select {
	case <-v.done:
	case <-time.After(60 * time.Second):
		v.kill()
		return errors.New("guest did not power off after priming")
	}
	data, _ := os.ReadFile(console)
	if !bytes.Contains(data, []byte("MPIB-LAB-PRIMED rc=0")) {
		return fmt.Errorf("node image import failed:\n%s", tail(data, 1500))
	}
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago: want when it is (not 0),
// else any.
func freePort(want int) (int, error) {
	if want != 0 {
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(want)); err == nil {
			l.Close()
			return want, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pingDocker checks a Docker engine over TCP.
func pingDocker(ctx context.Context, hostport string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+hostport+"/_ping", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("docker ping: %s", resp.Status)
	}
	return nil
}

package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	tcnetwork "github.com/testcontainers/testcontainers-go/network"

	"github.com/mpib/mpib/internal/lab"
)

// labLabel marks every container and network of the harness, so that leftovers of an
// interrupted run on a reused lab can be removed before a new topology comes up.
const labLabel = "org.mpib.lab"

// NodeBuildDir is where each node sees the repository's build/ directory (read-only).
const NodeBuildDir = "/opt/mpib"

// Topology is the two-island lab: nodes a1, a2 (island A), b1, b2 (island B) and a
// router r joining the islands' SOUT subnets.
type Topology struct {
	env       *lab.Env
	cfg       lab.Config
	cli       *testcontainers.DockerClient
	nets      map[string]*testcontainers.DockerNetwork
	nodes     map[string]*Node
	router    *Node
	exclusive bool   // RDMA netns mode of the engine's kernel
	unlock    func() // releases the topology lock
}

// Start makes a lab available (see internal/lab: an already running VM, the host's own
// kernel, or a VM booted now) and brings up the topology on it. A failed attempt is tried
// again, on a rebooted lab when the guest was lost (multi-threaded TCG occasionally panics)
// and on the same one when it still answers.
func Start(ctx context.Context) (*Topology, error) {
	root, err := lab.FindRepoRoot(".")
	if err != nil {
		return nil, err
	}
	cfg := lab.DefaultConfig(root)
	cfg.Log = os.Stderr
	// One topology per lab at a time: runs sharing the cache (and so the lab) take turns.
	unlock, err := lab.Lock(ctx, cfg, "topology")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 1; attempt <= topologyAttempts; attempt++ {
		env, err := lab.Up(ctx, cfg)
		if err != nil {
			unlock()
			return nil, err
		}
		t, err := startTopology(ctx, cfg, env)
		if err == nil {
			t.unlock = unlock
			return t, nil
		}
		lastErr = err
		if ctx.Err() != nil || attempt == topologyAttempts {
			break
		}
		if !env.Owned && !labDied(ctx, cfg) {
			// Another process's VM that still answers is never replaced under its owner;
			// the topology is tried again on it (its failed attempt has been torn down).
			fmt.Fprintf(os.Stderr, "lab: topology attempt %d failed, trying again on the running lab: %v\n", attempt, err)
			continue
		}
		fmt.Fprintf(os.Stderr, "lab: topology attempt %d failed, rebooting the lab: %v\n", attempt, err)
		_ = lab.Down(ctx, cfg)
		// The same Docker address again: testcontainers-go keeps the first one it read.
		if u, perr := url.Parse(env.DockerHost); perr == nil {
			cfg.DockerPort, _ = strconv.Atoi(u.Port())
		}
	}
	unlock()
	return nil, lastErr
}

const topologyAttempts = 2

// labDied says whether the lab VM that another process booted (`go run mage.go test` boots it
// beside the unit tests) is gone or no longer answers: then this run replaces it, as it does
// its own (a guest kernel under TCG can panic while Docker starts the topology's containers;
// without a retry the suite would fail with "no lab"). A VM that still works is never replaced
// under its owner.
func labDied(ctx context.Context, cfg lab.Config) bool {
	_, err := lab.Status(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lab: the running lab VM failed: %v\n", err)
	}
	return err != nil
}

func startTopology(ctx context.Context, cfg lab.Config, env *lab.Env) (t *Topology, err error) {
	// testcontainers-go reads its configuration once, from the environment: set it first.
	// There is no registry to pull its reaper from, so the harness cleans up itself.
	os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	if env.DockerHost != "" {
		os.Setenv("DOCKER_HOST", env.DockerHost)
	}
	if os.Getenv("MPIB_LAB_VERBOSE") != "1" {
		tclog.SetDefault(tclog.NewNoopLogger()) // one line per container step otherwise
	}
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	t = &Topology{env: env, cfg: cfg, cli: cli, nets: map[string]*testcontainers.DockerNetwork{}, nodes: map[string]*Node{}}
	built := t // the failing step's `return nil, err` clears t before this runs
	defer func() {
		if err != nil {
			_ = built.teardown(context.WithoutCancel(ctx))
		}
	}()
	start := time.Now()
	var phases []string
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"cleanup", t.removeLeftovers},
		{"networks", t.createNetworks},
		{"containers", t.createNodes},
		{"build copy", t.copyBuild},
		{"routes", t.route},
		{"rxe", t.createRxe},
	} {
		t0 := time.Now()
		if err := step.fn(ctx); err != nil {
			return nil, err
		}
		phases = append(phases, fmt.Sprintf("%s %.1f", step.name, time.Since(t0).Seconds()))
	}
	fmt.Fprintf(os.Stderr, "lab: topology up in %.1f s (%s; engine %s, rdma netns %s)\n",
		time.Since(start).Seconds(), strings.Join(phases, ", "), env.Mode,
		map[bool]string{true: "exclusive", false: "shared"}[t.exclusive])
	return t, nil
}

// Close removes the topology, and powers the lab VM off when Start booted it (unless
// MPIB_LAB_KEEP=1, which keeps it for the next run).
func (t *Topology) Close(ctx context.Context) error {
	err := t.teardown(ctx)
	if t.env.Owned && os.Getenv("MPIB_LAB_KEEP") != "1" {
		if derr := lab.Down(ctx, t.cfg); derr != nil && !errors.Is(derr, lab.ErrNotRunning) {
			err = errors.Join(err, derr)
		}
	}
	if t.unlock != nil {
		t.unlock()
		t.unlock = nil
	}
	return err
}

// Node returns a compute node by name ("a1", "a2", "b1", "b2"), or nil.
func (t *Topology) Node(name string) *Node { return t.nodes[name] }

// Nodes returns the compute nodes in a fixed order.
func (t *Topology) Nodes() []*Node {
	var out []*Node
	for _, s := range nodeSpecs {
		out = append(out, t.nodes[s.name])
	}
	return out
}

// Router returns the router node r (SOUT only, no RDMA devices).
func (t *Topology) Router() *Node { return t.router }

// Shape sets the egress qdisc of node n's rail netdev, e.g. "netem rate 100mbit" or
// "tbf rate 100mbit burst 64kb latency 100ms"; "" removes shaping. Keep bursts large:
// a dropped packet costs rxe a go-back-N retransmission, and a tbf with a small limit
// has killed QPs (retry exceeded).
func (t *Topology) Shape(ctx context.Context, n *Node, r Rail, qdisc string) error {
	dev := n.Netdev(r)
	var cmd []string
	if strings.TrimSpace(qdisc) == "" {
		cmd = []string{"sh", "-c", "tc qdisc del dev " + dev + " root 2>/dev/null || true"}
	} else {
		cmd = append([]string{"tc", "qdisc", "replace", "dev", dev, "root"}, strings.Fields(qdisc)...)
	}
	_, stderr, code, err := n.Exec(ctx, nil, cmd...)
	if err == nil && code != 0 {
		err = fmt.Errorf("%s: %s: exit %d: %s", n.name, strings.Join(cmd, " "), code, strings.TrimSpace(stderr))
	}
	return err
}

func (t *Topology) removeLeftovers(ctx context.Context) error {
	f := client.Filters{}.Add("label", labLabel)
	ctrs, err := t.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	for _, c := range ctrs.Items {
		if _, err := t.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
			return fmt.Errorf("remove leftover container %s: %w", c.ID, err)
		}
	}
	nets, err := t.cli.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		return fmt.Errorf("list networks: %w", err)
	}
	for _, n := range nets.Items {
		if _, err := t.cli.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil {
			return fmt.Errorf("remove leftover network %s: %w", n.Name, err)
		}
	}
	return nil
}

func (t *Topology) createNetworks(ctx context.Context) error {
	var mu sync.Mutex
	return forEach(len(netSpecs), func(i int) error {
		s := netSpecs[i]
		ipam := &network.IPAM{Config: []network.IPAMConfig{{
			Subnet:  netip.MustParsePrefix(s.subnet),
			Gateway: netip.MustParseAddr(s.gateway),
		}}}
		n, err := tcnetwork.New(ctx, tcnetwork.WithIPAM(ipam), tcnetwork.WithLabels(map[string]string{labLabel: s.key}))
		if err != nil {
			return fmt.Errorf("network %s (%s): %w", s.key, s.subnet, err)
		}
		mu.Lock()
		t.nets[s.key] = n
		mu.Unlock()
		return nil
	})
}

// forEach runs fn(0..n-1) concurrently and joins their errors.
func forEach(n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// attachment is one network interface of a container, with its fixed address.
type attachment struct {
	net string // netSpecs key
	ip  string
}

func (t *Topology) createNodes(ctx context.Context) error {
	type job struct {
		name    string
		role    string
		attach  []attachment
		hostPID bool
	}
	var jobs []job
	for _, s := range nodeSpecs {
		var attach []attachment
		for _, r := range s.rails {
			attach = append(attach, attachment{netKey(r, s.island), s.ip(r)})
		}
		jobs = append(jobs, job{name: s.name, role: "node", attach: attach})
	}
	jobs = append(jobs,
		// The router also shares the engine host's PID namespace: it creates the rxe devices
		// on the nodes' netdevs and moves them into the nodes' namespaces (one container
		// fewer: each costs seconds under TCG).
		job{name: "r", role: "router", attach: []attachment{{"sout-a", routerA}, {"sout-b", routerB}}, hostPID: true},
	)
	var mu sync.Mutex
	return forEach(len(jobs), func(i int) error {
		j := jobs[i]
		n, err := t.createContainer(ctx, j.name, j.attach, j.hostPID)
		if err != nil {
			return fmt.Errorf("container %s: %w", j.name, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if j.role == "router" {
			t.router = n
		} else {
			t.nodes[j.name] = n
		}
		return nil
	})
}

// createContainer starts a privileged container of the node image. The engine may speak
// only API 1.41 (bookworm's Docker), which cannot create a container on two networks at
// once: the first network is given at create, the second connected in a PostCreates hook,
// both with fixed addresses. Interface names then do not follow attach order, so netdevs
// are found by address later.
func (t *Topology) createContainer(ctx context.Context, name string, attach []attachment, hostPID bool) (*Node, error) {
	req := testcontainers.ContainerRequest{
		Image:      t.env.Image,
		Name:       "mpib-lab-" + name,
		Entrypoint: []string{"sleep", "infinity"},
		Labels:     map[string]string{labLabel: name},
		ConfigModifier: func(c *container.Config) {
			c.Hostname = name
		},
		HostConfigModifier: func(hc *container.HostConfig) {
			hc.Privileged = true
			hc.Binds = append(hc.Binds, "/dev/infiniband:/dev/infiniband",
				t.nodeBuildSource()+":"+NodeBuildDir+":ro")
			if hostPID {
				hc.PidMode = "host"
			}
		},
	}
	if len(attach) > 0 {
		first := t.nets[attach[0].net].Name
		req.Networks = []string{first}
		req.EndpointSettingsModifier = func(m map[string]*network.EndpointSettings) {
			es := m[first]
			if es == nil {
				es = &network.EndpointSettings{}
				m[first] = es
			}
			es.IPAMConfig = &network.EndpointIPAMConfig{IPv4Address: netip.MustParseAddr(attach[0].ip)}
		}
		var hooks []testcontainers.ContainerHook
		for _, a := range attach[1:] {
			hooks = append(hooks, func(ctx context.Context, c testcontainers.Container) error {
				_, err := t.cli.NetworkConnect(ctx, t.nets[a.net].ID, client.NetworkConnectOptions{
					Container: c.GetContainerID(),
					EndpointConfig: &network.EndpointSettings{
						IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: netip.MustParseAddr(a.ip)},
					},
				})
				return err
			})
		}
		req.LifecycleHooks = []testcontainers.ContainerLifecycleHooks{{PostCreates: hooks}}
	}
	ctr, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
	if err != nil {
		if ctr != nil {
			_ = ctr.Terminate(context.WithoutCancel(ctx), testcontainers.StopTimeout(0))
		}
		return nil, err
	}
	n := &Node{name: name, topo: t, ctr: ctr.(*testcontainers.DockerContainer),
		ip: map[Rail]string{}, dev: map[Rail]string{}, netdev: map[Rail]string{}, gid: map[Rail]int{}}
	if n.runner, err = startRunner(ctx, t.cli.Client, name, ctr.GetContainerID()); err != nil {
		_ = ctr.Terminate(context.WithoutCancel(ctx), testcontainers.StopTimeout(0))
		return nil, err
	}
	for _, s := range nodeSpecs {
		if s.name == name {
			n.rails = s.rails
			for _, r := range s.rails {
				n.ip[r] = s.ip(r)
				n.dev[r] = name + "_" + r.suffix()
			}
		}
	}
	return n, nil
}

// route gives each node its only routes (to the other island's SOUT, via r) and makes r
// forward; Docker's default routes point at the engine host's bridge and are removed. It
// also finds each rail's netdev by address. One exec per node, all nodes at once.
func (t *Topology) route(ctx context.Context) error {
	script := "sysctl -qw net.ipv4.ip_forward=1 && ip route del default 2>/dev/null; true"
	if err := t.router.run(ctx, "sh", "-c", script); err != nil {
		return err
	}
	return forEach(len(nodeSpecs), func(i int) error {
		s := nodeSpecs[i]
		n := t.nodes[s.name]
		cmd := "ip route del default 2>/dev/null; set -e"
		for _, rt := range s.routes() {
			cmd += fmt.Sprintf("; ip route add %s via %s", rt[0], rt[1])
		}
		for _, r := range n.rails {
			cmd += "; ip -o -4 addr show to " + n.ip[r] + " | awk '{print $2}'"
		}
		out, err := n.output(ctx, "sh", "-c", cmd)
		if err != nil {
			return err
		}
		f := strings.Fields(out)
		if len(f) != len(n.rails) {
			return fmt.Errorf("%s: netdevs of %v by address: %q", n.name, n.rails, out)
		}
		for k, r := range n.rails {
			n.netdev[r] = strings.SplitN(f[k], "@", 2)[0]
		}
		return nil
	})
}

// guestBuildCopy is where, in the lab VM, the nodes' /opt/mpib comes from: a copy of the
// shared build directory on the guest's tmpfs, made by copyBuild for each topology.
const guestBuildCopy = "/run/mpib-opt"

// nodeBuildSource is the engine host's directory the nodes see at /opt/mpib: in the lab VM a
// copy of the build directory (copyBuild), on the host the build directory itself.
func (t *Topology) nodeBuildSource() string {
	if t.env.Mode == lab.ModeVM {
		return guestBuildCopy
	}
	return t.env.BuildDir
}

// copyBuild fills guestBuildCopy from the 9p share of build/ (lab VM only; Docker created the
// empty directory for the nodes' bind mounts). The share has no page cache (9p's default,
// cache=none, which keeps a kept VM coherent with rebuilds on the host): every process start
// read its binary and the plugin through 9p again unless a running process still mapped them,
// which beside a transfer makes one start of the Go CLI take seconds instead of a tenth of
// one. Copied per topology, so a topology always runs the build it started with. The host's
// Python environments (build/venv*, made by agent:test: hundreds of MB in thousands of files,
// minutes through 9p) stay out: their interpreter is the host's, and nodes never use them.
func (t *Topology) copyBuild(ctx context.Context) error {
	if t.env.Mode != lab.ModeVM {
		return nil
	}
	script := fmt.Sprintf("set -e; mkdir -p %[1]s; find %[1]s -mindepth 1 -delete; "+
		"find %[2]s -mindepth 1 -maxdepth 1 ! -name 'venv*' -exec cp -a -t %[1]s {} +", guestBuildCopy, t.env.BuildDir)
	if err := t.router.run(ctx, "nsenter", "-t", "1", "-m", "--", "sh", "-c", script); err != nil {
		return fmt.Errorf("copying the build into the lab VM: %w", err)
	}
	return nil
}

// createRxe makes each node's two rxe devices, <node>_sout and <node>_sup, on the netdevs
// holding its rail addresses, from the router (which shares the engine host's PID namespace
// and so reaches every namespace through nsenter). In exclusive RDMA netns mode (the lab VM boots with it) the
// device, created in the engine host's namespace, is moved into the node's namespace so
// each node sees only its own two devices; in shared mode (a host left at the default)
// every node sees all of them and tests select theirs by name.
func (t *Topology) createRxe(ctx context.Context) error {
	out, err := t.router.output(ctx, "rdma", "system", "show")
	if err != nil {
		return err
	}
	t.exclusive = strings.Contains(out, "netns exclusive")
	var script strings.Builder
	script.WriteString("set -e; mkdir -p /var/run/netns\n")
	for _, s := range nodeSpecs {
		n := t.nodes[s.name]
		info, err := n.ctr.Inspect(ctx)
		if err != nil {
			return err
		}
		pid := info.State.Pid
		fmt.Fprintf(&script, "ln -sfn /proc/%d/ns/net /var/run/netns/mpib-%s\n", pid, n.name)
		for _, r := range n.rails {
			fmt.Fprintf(&script, "nsenter -t %d -n rdma link add %s type rxe netdev %s\n", pid, n.dev[r], n.netdev[r])
			if t.exclusive {
				// The new device is in the initial namespace (PID 1's); move it from there.
				fmt.Fprintf(&script, "nsenter -t 1 -n rdma dev set %s netns mpib-%s\n", n.dev[r], n.name)
			}
		}
	}
	if err := t.router.run(ctx, "sh", "-c", script.String()); err != nil {
		return fmt.Errorf("rxe setup: %w", err)
	}
	return forEach(len(nodeSpecs), func(i int) error {
		return t.nodes[nodeSpecs[i].name].waitGIDs(ctx, 30*time.Second)
	})
}

func (t *Topology) teardown(ctx context.Context) error {
	var errs []error
	var all []*Node
	for _, n := range t.nodes {
		all = append(all, n)
	}
	all = append(all, t.router)
	errs = append(errs, forEach(len(all), func(i int) error {
		if all[i] == nil {
			return nil
		}
		all[i].runner.close()
		if err := all[i].ctr.Terminate(ctx, testcontainers.StopTimeout(0)); err != nil {
			return fmt.Errorf("terminate %s: %w", all[i].name, err)
		}
		return nil
	}))
	var keys []string
	for key := range t.nets {
		keys = append(keys, key)
	}
	errs = append(errs, forEach(len(keys), func(i int) error {
		if err := t.nets[keys[i]].Remove(ctx); err != nil {
			return fmt.Errorf("remove network %s: %w", keys[i], err)
		}
		return nil
	}))
	t.nodes, t.nets, t.router = map[string]*Node{}, map[string]*testcontainers.DockerNetwork{}, nil
	return errors.Join(errs...)
}

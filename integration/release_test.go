package integration

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/internal/lab"
)

// releaseSuffix ends the release tarball's name: mpib-VERSION-linux-x86_64.tar.gz
// (internal/dist), which unpacks into mpib-VERSION-linux-x86_64/.
const releaseSuffix = "-linux-x86_64.tar.gz"

// release is the tarball `go run mage.go dist` left in build/dist.
type release struct {
	name    string // the tarball's file name
	version string // as its name gives it
}

// dir is the folder the tarball unpacks into.
func (r release) dir() string { return strings.TrimSuffix(r.name, ".tar.gz") }

// TestRelease loads the release build in the lab: the tarball Dist built is unpacked into a
// fresh folder on a1 and a2 (one island), and the release's own mpib-nettest runs a short
// verified transfer a1 -> a2 with the release's own plugin (not build/'s). The plugin's init
// INFO line must name the release's version and commit, which build/'s plugin (no -X stamp)
// never does. It prints
//
//	release: tarball=NAME version=V loaded=true verified=true seconds=N
//
// The tarball must be built first (go run mage.go dist; the CI's test target runs Dist before
// the lab suite, so there a missing tarball fails the test).
func TestRelease(t *testing.T) {
	rel := findRelease(t)
	tp := labOrSkip(t)
	a1, a2 := tp.Node("a1"), tp.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	nodes := []*Node{a2, a1} // server (receiver), client (sender)
	dirs := make([]string, len(nodes))
	commits := make([]string, len(nodes))
	t.Cleanup(func() {
		for i, d := range dirs {
			if d != "" {
				_, _, _, _ = nodes[i].Exec(context.Background(), nil, "rm", "-rf", path.Dir(d))
			}
		}
	})
	if err := forEach(len(nodes), func(i int) error {
		var err error
		dirs[i], commits[i], err = unpackRelease(ctx, nodes[i], rel)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	res := runReleasePair(ctx, t, nodes[0], nodes[1], dirs[0], dirs[1])
	initLine := fmt.Sprintf("MPIB %s (commit %s)", rel.version, commits[0])
	loaded := strings.Contains(res.serverErr, initLine) && strings.Contains(res.clientErr, initLine)
	m := resultRe.FindStringSubmatch(res.serverOut)
	ok := res.serverCode == 0 && res.clientCode == 0 && m != nil && m[4] == "true"
	evidence("release:", "tarball=%s version=%s loaded=%t verified=%t seconds=%.1f",
		rel.name, rel.version, loaded, ok, time.Since(start).Seconds())
	if commits[0] != commits[1] {
		t.Errorf("a2 and a1 unpacked different commits: %s, %s", commits[0], commits[1])
	}
	if !loaded {
		t.Errorf("no plugin init line %q on both sides: not the release's plugin\n%s", initLine, res)
	}
	if !ok {
		t.Errorf("the release's nettest did not finish a verified transfer\n%s", res)
	}
}

// findRelease returns the one release tarball in the repository's build/dist. Without one it
// fails under CI (where Dist ran before the lab suite) and skips otherwise.
func findRelease(t *testing.T) release {
	t.Helper()
	root, err := lab.FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	found, err := filepath.Glob(filepath.Join(root, "build", "dist", "mpib-*"+releaseSuffix))
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case len(found) > 1:
		t.Fatalf("more than one release in build/dist: %v", found)
	case len(found) == 0 && os.Getenv("CI") != "":
		t.Fatalf("no release tarball in %s/build/dist: the CI runs Dist before the lab suite, and it left none", root)
	case len(found) == 0:
		t.Skipf("no release tarball in %s/build/dist: run `go run mage.go dist` first", root)
	}
	name := filepath.Base(found[0])
	return release{name: name, version: strings.TrimSuffix(strings.TrimPrefix(name, "mpib-"), releaseSuffix)}
}

// unpackRelease unpacks the release into a fresh folder of node n (one exec: execs are slow
// under TCG) and returns the release's root there (the fresh folder's only entry) and the commit its VERSION names. The nodes
// see the tarball under NodeBuildDir as they see the rest of build/. VERSION must name the
// version the tarball's name carries.
func unpackRelease(ctx context.Context, n *Node, rel release) (dir, commit string, err error) {
	script := `set -e; d=$(mktemp -d /tmp/mpib-release.XXXXXX); echo "$d"; tar -xzf "$0" -C "$d"; cat "$d/$1/VERSION"`
	out, err := n.output(ctx, "sh", "-c", script, NodeBuildDir+"/dist/"+rel.name, rel.dir())
	if err != nil {
		return "", "", fmt.Errorf("unpacking %s: %w", rel.name, err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[2], "commit ") {
		return "", "", fmt.Errorf("%s: unpacked %s: want the folder, then VERSION (version, commit HASH): %q", n.Name(), rel.name, out)
	}
	if lines[1] != rel.version {
		return "", "", fmt.Errorf("%s: VERSION of %s names %q, its name %q", n.Name(), rel.name, lines[1], rel.version)
	}
	return path.Join(lines[0], rel.dir()), strings.TrimPrefix(lines[2], "commit "), nil
}

// runReleasePair runs the release's mpib-nettest with the release's plugin on server and
// client, each from its own unpacked folder, for 8 MiB of verified messages.
func runReleasePair(ctx context.Context, t *testing.T, server, client *Node, serverDir, clientDir string) pairResult {
	t.Helper()
	port := strconv.Itoa(int(oobPort.Add(1)))
	args := func(dir string) []string {
		return []string{"--plugin", dir + "/lib/libnccl-net-mpib.so", "--timeout-s", "60",
			"--mode", "verify", "--bytes", "8M", "--max-size", "1M", "--window", "8"}
	}
	srv, err := server.Start(ctx, pluginEnv(server), append([]string{serverDir + "/bin/mpib-nettest",
		"--role", "server", "--oob-listen", server.IP(SOUT) + ":" + port}, args(serverDir)...)...)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := client.Start(ctx, pluginEnv(client), append([]string{clientDir + "/bin/mpib-nettest",
		"--role", "client", "--oob-connect", server.IP(SOUT) + ":" + port}, args(clientDir)...)...)
	if err != nil {
		srv.Kill(context.Background())
		t.Fatal(err)
	}
	return waitPair(ctx, t, srv, cli, "the release's nettest")
}

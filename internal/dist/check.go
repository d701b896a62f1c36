// Package dist builds and checks MPIB's release: the plugin, mpib-nettest and mpib-agent built
// for an old glibc baseline, the Python agent's wheel and sdist, the docs, a .deb of the
// plugin and SHA256SUMS, in one versioned tarball (docs/deploying.md, "Installing a release").
package dist

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Need is one thing a shipped binary asks of the dynamic loader: a library (DT_NEEDED, Symbol
// and Version empty), a version node of a library (.gnu.version_r, Symbol empty) or an
// imported symbol with the library and version node it binds to (either may be empty for an
// unversioned import).
type Need struct {
	File, Symbol, Library, Version string
}

// Limits is the oldest system the release must load on: the newest glibc and libibverbs
// version nodes a binary may need.
type Limits struct {
	Glibc   string // e.g. GLIBC_2.28 (RHEL 8)
	Ibverbs string // e.g. IBVERBS_1.1 (every rdma-core release)
}

// Baseline is the release's contract: RHEL 8's glibc 2.28, and libibverbs' IBVERBS_1.1 node,
// which every rdma-core (RHEL 8's and Ubuntu 20.04's included) provides.
var Baseline = Limits{Glibc: "GLIBC_2.28", Ibverbs: "IBVERBS_1.1"}

// glibcLibraries are the sonames glibc provides on every supported distribution (2.34 folded
// libpthread, libdl and librt into libc but still ships the old names as stubs).
var glibcLibraries = map[string]bool{
	"libc.so.6": true, "libpthread.so.0": true, "libdl.so.2": true, "libm.so.6": true,
	"libresolv.so.2": true, "librt.so.1": true, "ld-linux-x86-64.so.2": true,
}

// ibverbsLibrary is the one library outside glibc a release binary may need.
const ibverbsLibrary = "libibverbs.so.1"

// Violations returns one line per need that the limits forbid: a library that is neither
// glibc's nor libibverbs', a glibc or IBVERBS node newer than the limit, a private or foreign
// node. Lines are sorted and unique; none means the binaries load on the baseline.
func Violations(needs []Need, l Limits) ([]string, error) {
	glibcMax, err := parseNode(l.Glibc, "GLIBC_")
	if err != nil {
		return nil, fmt.Errorf("glibc limit: %w", err)
	}
	ibvMax, err := parseNode(l.Ibverbs, "IBVERBS_")
	if err != nil {
		return nil, fmt.Errorf("ibverbs limit: %w", err)
	}
	seen := map[string]bool{}
	for _, n := range needs {
		if why := violation(n, glibcMax, ibvMax, l); why != "" {
			seen[fmt.Sprintf("%s: %s", n.File, why)] = true
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	sort.Strings(out)
	return out, nil
}

// violation says why one need breaks the limits, or returns "".
func violation(n Need, glibcMax, ibvMax []int, l Limits) string {
	what := n.Library
	if n.Symbol != "" {
		what = n.Symbol + " from " + n.Library
	}
	if n.Library == "" { // an unversioned import: the loader binds it anywhere
		if n.Version != "" {
			return fmt.Sprintf("%s needs %s of no library", n.Symbol, n.Version)
		}
		return ""
	}
	var prefix string
	var max []int
	var limit string
	switch {
	case glibcLibraries[n.Library]:
		prefix, max, limit = "GLIBC_", glibcMax, l.Glibc
	case n.Library == ibverbsLibrary:
		prefix, max, limit = "IBVERBS_", ibvMax, l.Ibverbs
	default:
		return fmt.Sprintf("needs %s: only glibc and %s may be needed", n.Library, ibverbsLibrary)
	}
	if n.Version == "" {
		return ""
	}
	v, err := parseNode(n.Version, prefix)
	if err != nil {
		return fmt.Sprintf("%s needs node %s: not a public %s node", what, n.Version, strings.TrimSuffix(prefix, "_"))
	}
	if compareVersions(v, max) > 0 {
		return fmt.Sprintf("%s needs %s, newer than %s", what, n.Version, limit)
	}
	return ""
}

// MaxNode returns the newest version node with prefix ("GLIBC_", "IBVERBS_") among needs, or
// "" when none needs one.
func MaxNode(needs []Need, prefix string) string {
	best, bestV := "", []int(nil)
	for _, n := range needs {
		v, err := parseNode(n.Version, prefix)
		if err != nil {
			continue
		}
		if best == "" || compareVersions(v, bestV) > 0 {
			best, bestV = n.Version, v
		}
	}
	return best
}

// parseNode reads a version node such as GLIBC_2.3.2 into its numbers.
func parseNode(node, prefix string) ([]int, error) {
	rest, ok := strings.CutPrefix(node, prefix)
	if !ok || rest == "" {
		return nil, fmt.Errorf("%q is not a %sX.Y node", node, prefix)
	}
	parts := strings.Split(rest, ".")
	v := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || p != strconv.Itoa(n) {
			return nil, fmt.Errorf("%q is not a %sX.Y node", node, prefix)
		}
		v[i] = n
	}
	return v, nil
}

// compareVersions orders dotted versions numerically; a missing part counts as 0 (2.3 = 2.3.0).
func compareVersions(a, b []int) int {
	for i := 0; i < len(a) || i < len(b); i++ {
		var x, y int
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

package dist

import (
	"archive/zip"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// releaseDir is where `go run mage.go dist` leaves the release, seen from this package.
const releaseDir = "../../build/dist"

// TestRelease checks the release tarball that Dist built: every listed checksum, the shipped
// binaries' needs against Baseline, the plugin's exports, the version and commit stamped in
// the plugin, mpib-agent and the .deb, the .deb's plugin, and the release's version (Python's
// form) in the Python wheel's and sdist's metadata. It prints
// "dist: glibc_max=X ibverbs_max=Y files=N verified=true ...".
func TestRelease(t *testing.T) {
	tarballs, err := filepath.Glob(filepath.Join(releaseDir, "mpib-*-linux-x86_64.tar.gz"))
	if err != nil || len(tarballs) == 0 {
		t.Skipf("dist: no release in build/dist (go run mage.go dist builds it; test:unit runs it first)")
	}
	if len(tarballs) > 1 {
		t.Fatalf("more than one release in build/dist: %v", tarballs)
	}
	data, err := os.ReadFile(tarballs[0])
	if err != nil {
		t.Fatal(err)
	}
	files, err := ReadTarGz(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", tarballs[0], err)
	}
	others := map[string][]byte{}
	for name, b := range files {
		if name != SumsFile {
			others[name] = b
		}
	}
	if err := VerifySums(files[SumsFile], others); err != nil {
		t.Fatal(err)
	}
	needs := checkNeeds(t, files)
	checkExports(t, files["lib/libnccl-net-mpib.so"])
	version, commit := checkStamps(t, files, filepath.Base(tarballs[0]))
	checkDeb(t, files, version, commit)
	pyVersion := checkPython(t, files, version)
	for _, f := range append([]string{"docs/deploying.md"}, releaseScripts...) {
		if !anyMatch(files, f) {
			t.Errorf("the release has no %s", f)
		}
	}
	if t.Failed() {
		return
	}
	fmt.Printf("dist: glibc_max=%s ibverbs_max=%s files=%d verified=true version=%s python_version=%s\n",
		strings.TrimPrefix(MaxNode(needs, "GLIBC_"), "GLIBC_"), MaxNode(needs, "IBVERBS_"), len(Binaries), version, pyVersion)
}

// checkNeeds reads the shipped binaries' needs and fails on any beyond Baseline.
func checkNeeds(t *testing.T, files map[string][]byte) []Need {
	var needs []Need
	for _, b := range Binaries {
		data, ok := files[b]
		if !ok {
			t.Fatalf("the release has no %s", b)
		}
		n, err := ReadNeeds(b, bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		needs = append(needs, n...)
	}
	bad, err := Violations(needs, Baseline)
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("needs beyond glibc %s / %s:\n  %s", Baseline.Glibc, Baseline.Ibverbs, strings.Join(bad, "\n  "))
	}
	if MaxNode(needs, "IBVERBS_") == "" {
		t.Fatal("no binary needs an IBVERBS node: the plugin is not linked to libibverbs")
	}
	return needs
}

// checkExports fails unless the plugin exports exactly NCCL's plugin tables (exports.map).
func checkExports(t *testing.T, so []byte) {
	f, err := elf.NewFile(bytes.NewReader(so))
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			got = append(got, s.Name)
		}
	}
	sort.Strings(got)
	want := []string{"ncclNetPlugin_v10", "ncclNetPlugin_v11", "ncclNetPlugin_v12", "ncclNetPlugin_v7", "ncclNetPlugin_v8", "ncclNetPlugin_v9"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("the plugin exports %v, want %v", got, want)
	}
	if f.Section(".symtab") == nil {
		t.Error("the plugin lost its static symbol table (gdb and perf name nothing)")
	}
}

// checkStamps reads VERSION and checks that the tarball's name, the plugin and
// `mpib-agent --version` carry its version and commit.
func checkStamps(t *testing.T, files map[string][]byte, tarball string) (version, commit string) {
	lines := strings.Split(strings.TrimSpace(string(files["VERSION"])), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "commit ") {
		t.Fatalf("VERSION is %q, want VERSION\\ncommit HASH", files["VERSION"])
	}
	version, commit = lines[0], strings.TrimPrefix(lines[1], "commit ")
	if tarball != "mpib-"+version+"-linux-x86_64.tar.gz" {
		t.Errorf("tarball %s does not carry version %s", tarball, version)
	}
	so := files["lib/libnccl-net-mpib.so"]
	if !bytes.Contains(so, []byte(version)) || !bytes.Contains(so, []byte(commit)) {
		t.Errorf("the plugin does not carry %s and %s for its init INFO line", version, commit)
	}
	agent := filepath.Join(t.TempDir(), "mpib-agent")
	if err := os.WriteFile(agent, files["bin/mpib-agent"], 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(agent, "--version").CombinedOutput()
	if want := fmt.Sprintf("mpib-agent %s (commit %s)\n", version, commit); err != nil || string(out) != want {
		t.Errorf("mpib-agent --version: %q (%v), want %q", out, err, want)
	}
	return version, commit
}

// checkDeb checks the .deb's name, and with dpkg-deb at hand its dependencies and that it
// installs the release's plugin where the loader finds it.
func checkDeb(t *testing.T, files map[string][]byte, version, commit string) {
	debVersion, err := DebVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("deb/%s_%s_amd64.deb", debPackage, debVersion)
	data, ok := files[name]
	if !ok {
		t.Fatalf("the release has no %s", name)
	}
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Logf("dpkg-deb not installed: the .deb's content is not checked")
		return
	}
	deb := filepath.Join(t.TempDir(), "p.deb")
	if err := os.WriteFile(deb, data, 0o644); err != nil {
		t.Fatal(err)
	}
	depends, err := exec.Command("dpkg-deb", "-f", deb, "Depends").Output()
	if err != nil || !strings.Contains(string(depends), "libibverbs1") {
		t.Errorf("the .deb's Depends is %q (%v), want libibverbs1", depends, err)
	}
	tarball, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	inside, err := ReadTar(bytes.NewReader(tarball))
	if err != nil {
		t.Fatal(err)
	}
	if so := inside["./"+DebLibDir+"/libnccl-net-mpib.so"]; !bytes.Equal(so, files["lib/libnccl-net-mpib.so"]) {
		t.Errorf("the .deb does not install the release's plugin at /%s", DebLibDir)
	}
}

func anyMatch(files map[string][]byte, glob string) bool {
	for name := range files {
		if ok, _ := filepath.Match(glob, name); ok {
			return true
		}
	}
	return false
}

// checkPython checks that the wheel and the sdist carry the release's version in Python's form
// (PythonVersion): in their names, their metadata and the package's __version__. It returns
// that version.
func checkPython(t *testing.T, files map[string][]byte, version string) string {
	want, err := PythonVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	wheel, ok := files["python/mpib_agent-"+want+"-py3-none-any.whl"]
	if !ok {
		t.Errorf("the release has no python/mpib_agent-%s-py3-none-any.whl", want)
	} else {
		checkPythonFiles(t, "wheel", readZip(t, wheel), want,
			"mpib_agent-"+want+".dist-info/METADATA", "mpib_agent/__init__.py")
	}
	sdist, ok := files["python/mpib_agent-"+want+".tar.gz"]
	if !ok {
		t.Errorf("the release has no python/mpib_agent-%s.tar.gz", want)
	} else {
		inside, err := ReadTarGz(bytes.NewReader(sdist)) // its mpib_agent-VERSION/ cut off
		if err != nil {
			t.Fatalf("sdist: %v", err)
		}
		checkPythonFiles(t, "sdist", inside, want, "PKG-INFO", "src/mpib_agent/__init__.py")
	}
	return want
}

// checkPythonFiles checks one archive's metadata file ("Version: V") and __init__.py.
func checkPythonFiles(t *testing.T, what string, files map[string][]byte, want, metadata, init string) {
	meta, ok := files[metadata]
	if !ok {
		t.Errorf("the %s has no %s", what, metadata)
	} else if got := metadataVersion(meta); got != want {
		t.Errorf("the %s's %s names version %q, want %q", what, metadata, got, want)
	}
	if v, err := sourcePythonVersion(files[init]); err != nil || v != want {
		t.Errorf("the %s's %s names __version__ %q (%v), want %q", what, init, v, err, want)
	}
}

// metadataVersion is the Version field of core metadata (METADATA, PKG-INFO).
func metadataVersion(meta []byte) string {
	for _, l := range strings.Split(string(meta), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "Version: "); ok {
			return v
		}
		if l == "" {
			break // the headers end; the description follows
		}
	}
	return ""
}

// readZip reads every file of a zip archive (a wheel).
func readZip(t *testing.T, data []byte) map[string][]byte {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatalf("wheel: %v", err)
	}
	files := map[string][]byte{}
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatalf("wheel: %s: %v", f.Name, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("wheel: %s: %v", f.Name, err)
		}
		files[f.Name] = b
	}
	return files
}

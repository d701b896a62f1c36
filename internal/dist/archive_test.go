package dist

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

func TestSumsRoundTrip(t *testing.T) {
	fsys := fstest.MapFS{
		"lib/a.so":  {Data: []byte("so")},
		"VERSION":   {Data: []byte("1.2.3\n")},
		SumsFile:    {Data: []byte("stale, never hashed")},
		"docs/x.md": {Data: []byte("")},
	}
	sums, err := Sums(fsys)
	if err != nil {
		t.Fatal(err)
	}
	v := sha256.Sum256([]byte("1.2.3\n"))
	if !strings.Contains(string(sums), hex.EncodeToString(v[:])+"  VERSION\n") || strings.Count(string(sums), "\n") != 3 ||
		strings.Contains(string(sums), SumsFile) {
		t.Fatalf("sums:\n%s", sums)
	}
	files := map[string][]byte{"lib/a.so": []byte("so"), "VERSION": []byte("1.2.3\n"), "docs/x.md": nil}
	if err := VerifySums(sums, files); err != nil {
		t.Fatalf("own sums: %v", err)
	}
	files["lib/a.so"] = []byte("changed")
	if err := VerifySums(sums, files); err == nil {
		t.Fatal("a changed file passed")
	}
	files["lib/a.so"] = []byte("so")
	files["extra"] = []byte("x")
	if err := VerifySums(sums, files); err == nil {
		t.Fatal("an unlisted file passed")
	}
	delete(files, "extra")
	delete(files, "docs/x.md")
	if err := VerifySums(sums, files); err == nil {
		t.Fatal("a listed but missing file passed")
	}
	if err := VerifySums([]byte("nohash\n"), nil); err == nil {
		t.Fatal("a malformed line passed")
	}
}

// The tarball holds the tree under one folder, plain files only, and is the same bytes for
// the same files (a rebuild of one commit is comparable by its hash).
func TestWriteTarGz(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "bin", "tool"), []byte("#!/bin/sh\n"), 0o700))
	must(os.WriteFile(filepath.Join(dir, "README"), []byte("hi"), 0o600))
	mtime := time.Unix(1700000000, 0)
	var tars [2][]byte
	for i := range tars {
		dst := filepath.Join(t.TempDir(), "r.tar.gz")
		must(WriteTarGz(dst, dir, "mpib-1.2.3", mtime))
		data, err := os.ReadFile(dst)
		must(err)
		tars[i] = data
	}
	if !bytes.Equal(tars[0], tars[1]) {
		t.Fatal("two archives of the same tree differ")
	}
	files, err := ReadTarGz(bytes.NewReader(tars[0]))
	must(err)
	if len(files) != 2 || string(files["bin/tool"]) != "#!/bin/sh\n" || string(files["README"]) != "hi" {
		t.Fatalf("read back: %v", files)
	}
	must(os.Symlink("README", filepath.Join(dir, "link")))
	if err := WriteTarGz(filepath.Join(t.TempDir(), "r.tar.gz"), dir, "p", mtime); err == nil {
		t.Fatal("a symlink was archived")
	}
}

func TestReadNeedsRefusesNonELF(t *testing.T) {
	if _, err := ReadNeeds("x", strings.NewReader("#!/bin/sh\n")); err == nil {
		t.Fatal("a shell script read as ELF")
	}
}

// A dynamic binary of the host (/bin/sh) needs libc with its version nodes, and the check
// reports it exactly when one is past the baseline.
func TestReadNeedsRealBinaries(t *testing.T) {
	data, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Skipf("no /bin/sh: %v", err)
	}
	needs, err := ReadNeeds("sh", bytes.NewReader(data))
	if err != nil || len(needs) == 0 {
		t.Skipf("/bin/sh is not a dynamic x86-64 ELF here (%v)", err)
	}
	top := MaxNode(needs, "GLIBC_")
	if top == "" {
		t.Fatalf("/bin/sh needs no GLIBC_ node: %v", needs)
	}
	bad, err := Violations(needs, Baseline)
	if err != nil {
		t.Fatal(err)
	}
	newer := compareVersions(mustParse(t, top), mustParse(t, Baseline.Glibc)) > 0
	if newer != (len(bad) > 0) {
		t.Fatalf("/bin/sh needs up to %s; violations %q", top, bad)
	}
}

func mustParse(t *testing.T, node string) []int {
	v, err := parseNode(node, "GLIBC_")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

package dist

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mpib/mpib/internal/buildinfo"
)

// The tree's Python package names the development version the Go binaries name unstamped, in
// Python's form: a plain `pip install ./agent/python` is 0.0.0.dev0, never a release.
func TestSourcePythonVersion(t *testing.T) {
	init, err := os.ReadFile(filepath.Join("..", "..", "agent", "python", filepath.FromSlash(pythonInit)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := sourcePythonVersion(init)
	if err != nil {
		t.Fatal(err)
	}
	want, err := PythonVersion(buildinfo.DevVersion)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("agent/python names version %q, want %q (buildinfo.DevVersion in Python's form)", got, want)
	}
}

func TestSetPythonVersion(t *testing.T) {
	in := "\"\"\"doc\"\"\"\n\nx = 1\n__version__ = \"0.0.0.dev0\"\n__all__ = ()\n"
	out, err := setPythonVersion([]byte(in), "1.2.3rc1+4.gabc")
	if want := "\"\"\"doc\"\"\"\n\nx = 1\n__version__ = \"1.2.3rc1+4.gabc\"\n__all__ = ()\n"; err != nil || string(out) != want {
		t.Errorf("setPythonVersion = %q, %v; want %q", out, err, want)
	}
	for _, bad := range []string{"x = 1\n", "__version__ = \"1\"\n__version__ = \"2\"\n", "  __version__ = \"1\"\n"} {
		if out, err := setPythonVersion([]byte(bad), "1.2.3"); err == nil {
			t.Errorf("setPythonVersion(%q) = %q, want an error", bad, out)
		}
	}
}

// stagePython's copy names the release's version and leaves the tree's and its caches alone.
func TestStagePython(t *testing.T) {
	root := filepath.Join("..", "..")
	treeInit := filepath.Join(root, "agent", "python", filepath.FromSlash(pythonInit))
	before, err := os.ReadFile(treeInit)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := stagePython(root, "9.8.7rc1+2.gabc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	init, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(pythonInit)))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := sourcePythonVersion(init); err != nil || v != "9.8.7rc1+2.gabc" {
		t.Errorf("the copy names %q (%v), want 9.8.7rc1+2.gabc", v, err)
	}
	if after, err := os.ReadFile(treeInit); err != nil || string(after) != string(before) {
		t.Errorf("stagePython changed the tree's %s", pythonInit)
	}
	for _, f := range []string{"pyproject.toml", "README.md", "src/mpib_agent/_cli.py"} {
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f))); err != nil {
			t.Errorf("the copy lacks %s: %v", f, err)
		}
	}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && skipPythonEntry(d.Name()) {
			t.Errorf("the copy holds %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

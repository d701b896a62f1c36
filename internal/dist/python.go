package dist

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// pythonInit is the Python agent's package file, relative to agent/python: it holds the one
// `__version__ = "..."` line that flit reads as the wheel's and sdist's version (pyproject.toml
// declares the version dynamic).
const pythonInit = "src/mpib_agent/__init__.py"

// versionLineRE is that line.
var versionLineRE = regexp.MustCompile(`(?m)^__version__ = "([^"\n]*)"$`)

// sourcePythonVersion returns the version an __init__.py names.
func sourcePythonVersion(init []byte) (string, error) {
	m := versionLineRE.FindAllSubmatch(init, -1)
	if len(m) != 1 {
		return "", fmt.Errorf("%s: want one line `__version__ = \"...\"`, found %d", pythonInit, len(m))
	}
	return string(m[0][1]), nil
}

// setPythonVersion returns init with its version line naming v.
func setPythonVersion(init []byte, v string) ([]byte, error) {
	if _, err := sourcePythonVersion(init); err != nil {
		return nil, err
	}
	return versionLineRE.ReplaceAllLiteral(init, []byte(`__version__ = "`+v+`"`)), nil
}

// skipPythonEntry says whether a file or folder of agent/python stays out of the build's copy:
// caches and build leftovers, which are no part of the package.
func skipPythonEntry(name string) bool {
	return strings.HasPrefix(name, ".") || name == "__pycache__" || name == "build" || name == "dist" ||
		strings.HasSuffix(name, ".egg-info") || strings.HasSuffix(name, ".pyc")
}

// stagePython copies agent/python into a fresh temporary folder with the package's version
// set to pyVersion, and returns the folder: the wheel and sdist are built from the copy, so
// they carry the release's version while the work tree keeps its development version (what a
// plain `pip install ./agent/python` installs).
func stagePython(root, pyVersion string) (string, error) {
	src := filepath.Join(root, "agent", "python")
	dst, err := os.MkdirTemp("", "mpib-python-")
	if err != nil {
		return "", err
	}
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == src {
			return err
		}
		if skipPythonEntry(d.Name()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a plain file", p)
		}
		st, err := d.Info()
		if err != nil {
			return err
		}
		return copyFile(p, filepath.Join(dst, rel), st.Mode().Perm())
	})
	if err == nil {
		err = stampPythonInit(filepath.Join(dst, filepath.FromSlash(pythonInit)), pyVersion)
	}
	if err != nil {
		os.RemoveAll(dst)
		return "", err
	}
	return dst, nil
}

// stampPythonInit rewrites the copy's __init__.py to name v.
func stampPythonInit(path, v string) error {
	init, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := setPythonVersion(init, v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

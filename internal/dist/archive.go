package dist

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// SumsFile is the checksum list inside the release tree (sha256sum -c reads it).
const SumsFile = "SHA256SUMS"

// regularFiles lists the regular files under fsys, sorted, in slash form; anything else but a
// directory (a link, a device) is an error: a release holds plain files only.
func regularFiles(fsys fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
		case d.Type().IsRegular():
			files = append(files, p)
		default:
			return fmt.Errorf("%s: %v is not a plain file", p, d.Type())
		}
		return nil
	})
	sort.Strings(files)
	return files, err
}

// Sums renders sha256sum's format ("HEX  PATH" per line, sorted) for every regular file of
// fsys except SumsFile at its root.
func Sums(fsys fs.FS) ([]byte, error) {
	files, err := regularFiles(fsys)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, p := range files {
		if p == SumsFile {
			continue
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(sum[:]), p)
	}
	return b.Bytes(), nil
}

// VerifySums checks that sums (sha256sum's format) names every file in files exactly once
// with its content's hash, and nothing else; files maps a path to its content.
func VerifySums(sums []byte, files map[string][]byte) error {
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			return fmt.Errorf("%s: line %q is not \"HEX  PATH\"", SumsFile, sc.Text())
		}
		data, found := files[name]
		if !found || listed[name] {
			return fmt.Errorf("%s: %s is absent or listed twice", SumsFile, name)
		}
		got := sha256.Sum256(data)
		if hex.EncodeToString(got[:]) != sum {
			return fmt.Errorf("%s: %s has another hash", SumsFile, name)
		}
		listed[name] = true
	}
	for name := range files {
		if !listed[name] {
			return fmt.Errorf("%s: %s is not listed", SumsFile, name)
		}
	}
	return nil
}

// WriteTarGz writes the regular files under dir into a gzip'd tar at dst, under the top-level
// folder prefix. The archive depends only on the files: sorted entries, owner root, mtime
// fixed, modes 0755 for executables and 0644 otherwise.
func WriteTarGz(dst, dir, prefix string, mtime time.Time) error {
	fsys := os.DirFS(dir)
	files, err := regularFiles(fsys)
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	gz := gzip.NewWriter(out)
	tw := tar.NewWriter(gz)
	dirs := map[string]bool{}
	for _, p := range files {
		if err := addTarDirs(tw, dirs, path.Join(prefix, path.Dir(p)), mtime); err != nil {
			return err
		}
		if err := addTarFile(tw, fsys, p, path.Join(prefix, p), mtime); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return out.Close()
}

// addTarDirs writes the directory entries of dir and its parents not written yet.
func addTarDirs(tw *tar.Writer, done map[string]bool, dir string, mtime time.Time) error {
	if dir == "." || dir == "/" || done[dir] {
		return nil
	}
	if err := addTarDirs(tw, done, path.Dir(dir), mtime); err != nil {
		return err
	}
	done[dir] = true
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX})
}

func addTarFile(tw *tar.Writer, fsys fs.FS, src, name string, mtime time.Time) error {
	info, err := fs.Stat(fsys, src)
	if err != nil {
		return err
	}
	mode := int64(0o644)
	if info.Mode()&0o111 != 0 {
		mode = 0o755
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: info.Size(), Mode: mode, ModTime: mtime, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	f, err := fsys.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// ReadTarGz returns the regular files of a gzip'd tar, by name, with the top-level folder
// (the first path element) cut off.
func ReadTarGz(r io.Reader) (map[string][]byte, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	all, err := ReadTar(gz)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for name, data := range all {
		_, rest, ok := strings.Cut(name, "/")
		if !ok || rest == "" {
			return nil, fmt.Errorf("%s: not under the release's folder", name)
		}
		files[rest] = data
	}
	return files, nil
}

// ReadTar returns the regular files of a tar by their names in it.
func ReadTar(r io.Reader) (map[string][]byte, error) {
	tr := tar.NewReader(r)
	files := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[hdr.Name] = data
	}
}

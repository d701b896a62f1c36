// Package containers holds the recipe of the lab's node image: a Debian bookworm minbase
// rootfs with the packages in node/packages, slimmed by node/slim.sh and imported into
// Docker with `docker import` (no registry is involved).
package containers

import (
	"bufio"
	"bytes"
	"embed"
	"strings"
)

// Recipe holds the recipe files; internal/lab hashes them into the lab cache key.
//
//go:embed node
var Recipe embed.FS

// NodeImage is the tag the node image gets in the lab's Docker engine.
const NodeImage = "mpib-node:lab"

// NodePackages returns the packages installed in the node image.
func NodePackages() []string {
	data, err := Recipe.ReadFile("node/packages")
	if err != nil {
		panic(err) // embedded at build time: cannot be missing
	}
	var pkgs []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if f := strings.TrimSpace(line); f != "" {
			pkgs = append(pkgs, f)
		}
	}
	return pkgs
}

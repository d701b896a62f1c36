package dist

import (
	"fmt"
	"regexp"
	"strings"
)

// Package describes the plugin's .deb (DEBIAN/control).
type Package struct {
	Name          string // e.g. libnccl-net-mpib
	Version       string // a Debian version (DebVersion)
	Depends       string // e.g. libibverbs1, libc6 (>= 2.28)
	InstalledKiB  int64
	Maintainer    string
	Summary       string // the description's first line
	Description   string // further lines; may be empty
	Homepage      string // optional
	Architecture  string // amd64
	Section       string // libs
	MultiArchSame bool
}

var debNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// Control renders p as a DEBIAN/control file. A name, version or summary that dpkg would
// refuse is an error here, with the field named.
func Control(p Package) (string, error) {
	if !debNameRE.MatchString(p.Name) {
		return "", fmt.Errorf("deb Package %q: lower-case letters, digits and + - . only", p.Name)
	}
	if !debVersionRE.MatchString(p.Version) {
		return "", fmt.Errorf("deb Version %q: not a Debian version", p.Version)
	}
	if p.Summary == "" || strings.Contains(p.Summary, "\n") {
		return "", fmt.Errorf("deb Description: the summary must be one non-empty line")
	}
	if p.Architecture == "" || p.Maintainer == "" {
		return "", fmt.Errorf("deb Architecture and Maintainer are required")
	}
	var b strings.Builder
	field := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	field("Package", p.Name)
	field("Version", p.Version)
	field("Architecture", p.Architecture)
	if p.MultiArchSame {
		field("Multi-Arch", "same")
	}
	field("Maintainer", p.Maintainer)
	field("Section", p.Section)
	field("Priority", "optional")
	field("Depends", p.Depends)
	if p.InstalledKiB > 0 {
		field("Installed-Size", fmt.Sprint(p.InstalledKiB))
	}
	field("Homepage", p.Homepage)
	field("Description", p.Summary)
	for _, line := range strings.Split(strings.TrimSpace(p.Description), "\n") {
		switch line = strings.TrimRight(line, " \t"); {
		case strings.TrimSpace(p.Description) == "":
		case line == "":
			b.WriteString(" .\n") // a blank line of a long description
		default:
			b.WriteString(" " + line + "\n")
		}
	}
	return b.String(), nil
}

package dist

import (
	"fmt"
	"regexp"
	"strings"
)

// describeRE matches `git describe --tags --always --abbrev=12` once "-dirty" is cut off: a
// release tag (v1.2.3, 1.2.3-rc1), optionally followed by the commits since it and the commit
// ("-4-gabcdef123456"), or a bare commit where no tag exists.
var describeRE = regexp.MustCompile(`^(?:v?([0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.]+)?)(?:-([0-9]+)-g([0-9a-f]{4,40}))?|([0-9a-f]{4,40}))$`)

// ReleaseVersion turns `git describe --tags --always --dirty --abbrev=12` output into the
// release's version, a SemVer: a tag as is ("1.2.3"), commits past a tag as build metadata
// after it ("1.2.3+4.gabc"), an untagged history as a development version before any release
// ("0.0.0-dev+gabc"); uncommitted changes add ".dirty" (or "+dirty") so such a build never
// passes for the commit.
func ReleaseVersion(describe string) (string, error) {
	d := strings.TrimSpace(describe)
	d, dirty := strings.CutSuffix(d, "-dirty")
	m := describeRE.FindStringSubmatch(d)
	if m == nil {
		return "", fmt.Errorf("git describe gave %q: want a tag like v1.2.3[-N-gHASH] or a commit hash", describe)
	}
	var v string
	switch {
	case m[4] != "":
		v = "0.0.0-dev+g" + m[4]
	case m[2] != "":
		v = m[1] + "+" + m[2] + ".g" + m[3]
	default:
		v = m[1]
	}
	if dirty {
		if strings.Contains(v, "+") {
			v += ".dirty"
		} else {
			v += "+dirty"
		}
	}
	return v, nil
}

// debVersionRE is a Debian native version (no revision): a digit first, then alphanumerics and
// . + ~ only.
var debVersionRE = regexp.MustCompile(`^[0-9][0-9A-Za-z.+~]*$`)

// DebVersion writes a release version for dpkg: SemVer's pre-release hyphen becomes a tilde,
// so that 1.2.3-rc1 (1.2.3~rc1) and 0.0.0-dev sort before the release as they do in SemVer
// (a hyphen would start a Debian revision).
func DebVersion(v string) (string, error) {
	d := strings.ReplaceAll(v, "-", "~")
	if !debVersionRE.MatchString(d) {
		return "", fmt.Errorf("version %q does not make a Debian version (%q)", v, d)
	}
	return d, nil
}

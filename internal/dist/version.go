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

// semverRE splits a release version: MAJOR.MINOR.PATCH, an optional pre-release after "-", and
// optional build metadata after "+".
var semverRE = regexp.MustCompile(`^([0-9]+)\.([0-9]+)\.([0-9]+)(?:-([0-9A-Za-z.-]+))?(?:\+([0-9A-Za-z.-]+))?$`)

// preReleaseRE is a pre-release Python's versions can say: a phase with an optional number.
var preReleaseRE = regexp.MustCompile(`^(dev|a|alpha|b|beta|c|rc|pre|preview)[.-]?([0-9]*)$`)

// pythonPhase is the PEP 440 spelling of each pre-release phase; dev is a development release
// (".devN"), the others a pre-release ("aN", "bN", "rcN").
var pythonPhase = map[string]string{"dev": ".dev", "a": "a", "alpha": "a", "b": "b", "beta": "b",
	"c": "rc", "rc": "rc", "pre": "rc", "preview": "rc"}

// PythonVersion writes a release version for the Python agent's wheel and sdist, in PEP 440's
// normal form (what pip and the wheel's metadata show): a release as is ("1.2.3"), a
// pre-release in Python's spelling ("1.2.3-rc1" is "1.2.3rc1", "0.0.0-dev" is "0.0.0.dev0"),
// build metadata as a local version ("+4.gabc.dirty"). A pre-release Python cannot say
// ("1.2.3-foo") is an error: the wheel would not carry the release's version.
func PythonVersion(v string) (string, error) {
	m := semverRE.FindStringSubmatch(v)
	if m == nil {
		return "", fmt.Errorf("version %q is not MAJOR.MINOR.PATCH[-PRE][+BUILD]", v)
	}
	var b strings.Builder
	for i, n := range m[1:4] {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(trimZeros(n))
	}
	if pre := strings.ToLower(m[4]); pre != "" {
		p := preReleaseRE.FindStringSubmatch(pre)
		if p == nil {
			return "", fmt.Errorf("version %q: pre-release %q has no Python form (dev, a, b or rc, then a number)", v, m[4])
		}
		num := "0"
		if p[2] != "" {
			num = trimZeros(p[2])
		}
		b.WriteString(pythonPhase[p[1]] + num)
	}
	if m[5] != "" {
		var segs []string
		for _, s := range strings.FieldsFunc(strings.ToLower(m[5]), func(r rune) bool { return r == '.' || r == '-' }) {
			if strings.Trim(s, "0123456789") == "" {
				s = trimZeros(s) // a numeric local segment is a number: 007 is 7
			}
			segs = append(segs, s)
		}
		b.WriteString("+" + strings.Join(segs, "."))
	}
	return b.String(), nil
}

// trimZeros drops a decimal number's leading zeros ("007" is "7", "0" stays).
func trimZeros(n string) string {
	if t := strings.TrimLeft(n, "0"); t != "" {
		return t
	}
	return "0"
}

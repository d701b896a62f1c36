// Package buildinfo is the one source of a binary's version and commit: the plugin's init
// INFO line and `mpib-agent --version` both read it. The release build (internal/dist) sets
// both with the -ldflags LDFlags returns; any other build names a development version and the
// commit Go stamped into the binary, if any.
package buildinfo

import (
	"fmt"
	"reflect"
	"runtime/debug"
)

// Set by -X (LDFlags); empty in a build without them.
var (
	version string
	commit  string
)

// DevVersion is what a build without the release's stamp calls its version.
const DevVersion = "0.0.0-dev"

// marker gives the package's import path, which -X needs before each variable's name.
type marker struct{}

// LDFlags is the -ldflags fragment that stamps a release's version and commit into a binary
// that imports this package.
func LDFlags(version, commit string) string {
	p := reflect.TypeOf(marker{}).PkgPath()
	return fmt.Sprintf("-X %s.version=%s -X %s.commit=%s", p, version, p, commit)
}

// Version is the release version stamped into the binary, or DevVersion.
func Version() string {
	if version == "" {
		return DevVersion
	}
	return version
}

// Commit is the commit stamped into the binary, else the VCS revision go build recorded
// (-buildvcs, with "-dirty" for a modified tree), else "unknown".
func Commit() string {
	if commit != "" {
		return commit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return vcsCommit(info.Settings)
}

// Line names the program, its version and commit: "NAME VERSION (commit HASH)".
func Line(name string) string {
	return fmt.Sprintf("%s %s (commit %s)", name, Version(), Commit())
}

// vcsCommit reads the revision and the modified flag from go build's settings.
func vcsCommit(settings []debug.BuildSetting) string {
	rev, dirty := "unknown", ""
	for _, s := range settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	return rev + dirty
}

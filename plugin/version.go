// version.go: the version line init.go logs at init (versionLine), from the release build's
// -ldflags -X or the commit Go stamped into the binary.

package main

import (
	"fmt"
	"runtime/debug"
)

// The release build (internal/dist) sets these with -ldflags -X; mpib-agent --version names
// the same pair. A build without them names the commit Go stamped into the binary, if any.
var (
	buildVersion string
	buildCommit  string
)

// versionLine is the INFO line init logs: "MPIB VERSION (commit HASH)".
func versionLine() string {
	v, c := buildVersion, buildCommit
	if v == "" {
		v = "0.0.0-dev"
	}
	if c == "" {
		c = stampedCommit()
	}
	return fmt.Sprintf("MPIB %s (commit %s)", v, c)
}

// stampedCommit is the VCS revision go build recorded (-buildvcs), "-dirty" when the tree was
// modified, or "unknown".
func stampedCommit() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", ""
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	return rev + dirty
}

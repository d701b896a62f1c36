// version.go: the version line init.go logs at init (versionLine), from internal/buildinfo:
// the release build's stamp or the commit Go stamped into the binary.

package main

import "github.com/mpib/mpib/internal/buildinfo"

// versionLine is the INFO line init logs: "MPIB VERSION (commit HASH)", the pair
// mpib-agent --version names too.
func versionLine() string { return buildinfo.Line("MPIB") }

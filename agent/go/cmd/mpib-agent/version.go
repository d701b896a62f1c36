package main

import "github.com/mpib/mpib/internal/buildinfo"

// versionLine is what --version prints: "mpib-agent VERSION (commit HASH)", from
// internal/buildinfo (the release build's stamp, the pair the plugin's init INFO line names).
func versionLine() string { return buildinfo.Line(prog) }

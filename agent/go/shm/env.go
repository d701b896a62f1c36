package shm

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// setting is an MPIB_* variable as the plugin reads its settings (plugin/internal/config):
// leading and trailing white space (unicode.IsSpace) removed.
func setting(name string) string { return strings.TrimSpace(os.Getenv(name)) }

// DefaultPath is $MPIB_SHM_PATH (white space trimmed, as the plugin reads it), else
// /dev/shm/mpib-hints-EUID (the plugin's default too).
func DefaultPath() string {
	if p := setting("MPIB_SHM_PATH"); p != "" {
		return p
	}
	return DefaultPathPrefix + strconv.Itoa(os.Geteuid())
}

// StaleFromEnv is MPIB_AGENT_STALE_MS read as the plugin reads it: white space trimmed, then a
// signed decimal integer (strconv.Atoi: " 100 " and "+100" are 100) in 1..3600000. Unset,
// anything else or out of range: the default, 500 ms (the plugin refuses such a value).
func StaleFromEnv() time.Duration {
	ms := DefaultStaleMs
	if v, err := strconv.Atoi(setting("MPIB_AGENT_STALE_MS")); err == nil && v >= 1 && v <= MaxStaleMs {
		ms = v
	}
	return time.Duration(ms) * time.Millisecond
}

// BeatPeriod is how often an agent beats for a staleness limit: stale/4 (spec 5.2).
func BeatPeriod(stale time.Duration) time.Duration {
	return max(stale/4, time.Millisecond)
}

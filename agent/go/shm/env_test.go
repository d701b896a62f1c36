package shm

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// staleCases is MPIB_AGENT_STALE_MS as the plugin reads it (plugin/internal/config: white
// space trimmed with strings.TrimSpace, then strconv.Atoi, 1..3600000); the agents fall back to
// 500 ms where the plugin refuses the value. The Python agent's test_env.py has the same table.
var staleCases = []struct {
	env  string
	want time.Duration
}{
	{"", 500},
	{"100", 100},
	{"100 ", 100},
	{" 100 ", 100},
	{"\t100\n", 100},
	{"+100", 100},
	{"007", 7},
	{"\u00a0100\u3000", 100}, // no-break and ideographic spaces: unicode.IsSpace
	{"1", 1},
	{"3600000", 3600000},
	{"3600001", 500},
	{"0", 500},
	{"-5", 500},
	{"+", 500},
	{"1_000", 500},
	{"0x10", 500},
	{"1e3", 500},
	{"10 0", 500},
	{"１００", 500},     // fullwidth digits
	{"\x1c100", 500}, // a file separator is not white space to Go (it is to Python's str.strip)
	{"99999999999999999999", 500},
	{"fast", 500},
}

func TestStaleFromEnv(t *testing.T) {
	for _, c := range staleCases {
		t.Setenv("MPIB_AGENT_STALE_MS", c.env)
		if got := StaleFromEnv(); got != c.want*time.Millisecond {
			t.Errorf("MPIB_AGENT_STALE_MS=%q: expected %v but got %v", c.env, c.want*time.Millisecond, got)
		}
	}
}

// TestDefaultPathTrimmed: MPIB_SHM_PATH is trimmed as the plugin trims it; only white space
// means unset.
func TestDefaultPathTrimmed(t *testing.T) {
	def := DefaultPathPrefix + strconv.Itoa(os.Geteuid())
	for env, want := range map[string]string{" /dev/shm/x\n": "/dev/shm/x", "/dev/shm/x": "/dev/shm/x", " \t ": def, "": def} {
		t.Setenv("MPIB_SHM_PATH", env)
		if got := DefaultPath(); got != want {
			t.Errorf("MPIB_SHM_PATH=%q: expected %q but got %q", env, want, got)
		}
	}
}

package dist

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestMissingBuildPackages(t *testing.T) {
	found := func(string) (string, error) { return "/usr/bin/gcc", nil }
	absent := func(string) (string, error) { return "", errors.New("not found") }
	have := func(string) (os.FileInfo, error) { return nil, nil }
	lack := func(string) (os.FileInfo, error) { return nil, os.ErrNotExist }
	for _, c := range []struct {
		name string
		look func(string) (string, error)
		stat func(string) (os.FileInfo, error)
		want string
	}{
		{"everything there", found, have, ""},
		{"a bare machine with Go only", absent, lack, "gcc libc6-dev libibverbs-dev ibverbs-providers"},
		{"no compiler", absent, have, "gcc libc6-dev"},
		{"no verbs headers", found, lack, "libibverbs-dev ibverbs-providers"},
	} {
		if got := strings.Join(MissingBuildPackages(c.look, c.stat), " "); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

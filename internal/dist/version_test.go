package dist

import "testing"

func TestReleaseVersion(t *testing.T) {
	cases := []struct{ describe, want, deb string }{
		{"v1.2.3", "1.2.3", "1.2.3"},
		{"1.2.3\n", "1.2.3", "1.2.3"},
		{"v1.2.3-dirty", "1.2.3+dirty", "1.2.3+dirty"},
		{"v1.2.3-4-g0123456789ab", "1.2.3+4.g0123456789ab", "1.2.3+4.g0123456789ab"},
		{"v1.2.3-4-g0123456789ab-dirty", "1.2.3+4.g0123456789ab.dirty", "1.2.3+4.g0123456789ab.dirty"},
		{"v1.2.3-rc1", "1.2.3-rc1", "1.2.3~rc1"},
		{"v1.2.3-rc1-2-gabcdef", "1.2.3-rc1+2.gabcdef", "1.2.3~rc1+2.gabcdef"},
		{"214eb05a4eff", "0.0.0-dev+g214eb05a4eff", "0.0.0~dev+g214eb05a4eff"},
		{"214eb05a4eff-dirty", "0.0.0-dev+g214eb05a4eff.dirty", "0.0.0~dev+g214eb05a4eff.dirty"},
	}
	for _, c := range cases {
		got, err := ReleaseVersion(c.describe)
		if err != nil || got != c.want {
			t.Errorf("ReleaseVersion(%q) = %q, %v; want %q", c.describe, got, err, c.want)
			continue
		}
		deb, err := DebVersion(got)
		if err != nil || deb != c.deb {
			t.Errorf("DebVersion(%q) = %q, %v; want %q", got, deb, err, c.deb)
		}
	}
	for _, bad := range []string{"", "-dirty", "release-1", "v1.2", "v1.2.3-4-gXYZ", "fatal: no names found", "v1.2.3 extra"} {
		if v, err := ReleaseVersion(bad); err == nil {
			t.Errorf("ReleaseVersion(%q) = %q, want an error", bad, v)
		}
	}
}

func TestDebVersionRefuses(t *testing.T) {
	for _, bad := range []string{"", "v1.2.3", "1.2.3_4", "1.2 3"} {
		if d, err := DebVersion(bad); err == nil {
			t.Errorf("DebVersion(%q) = %q, want an error", bad, d)
		}
	}
}

func TestPythonVersion(t *testing.T) {
	cases := []struct{ version, want string }{
		{"1.2.3", "1.2.3"},
		{"01.02.030", "1.2.30"},
		{"1.2.3+dirty", "1.2.3+dirty"},
		{"1.2.3+4.g0123456789ab", "1.2.3+4.g0123456789ab"},
		{"1.2.3+4.g0123456789ab.dirty", "1.2.3+4.g0123456789ab.dirty"},
		{"1.2.3+007.x-y", "1.2.3+7.x.y"},
		{"1.2.3-rc1", "1.2.3rc1"},
		{"1.2.3-RC.2", "1.2.3rc2"},
		{"1.2.3-beta", "1.2.3b0"},
		{"1.2.3-alpha.3", "1.2.3a3"},
		{"1.2.3-rc1+2.gabcdef", "1.2.3rc1+2.gabcdef"},
		{"0.0.0-dev", "0.0.0.dev0"},
		{"0.0.0-dev+g214eb05a4eff", "0.0.0.dev0+g214eb05a4eff"},
		{"0.0.0-dev+g214eb05a4eff.dirty", "0.0.0.dev0+g214eb05a4eff.dirty"},
	}
	for _, c := range cases {
		if got, err := PythonVersion(c.version); err != nil || got != c.want {
			t.Errorf("PythonVersion(%q) = %q, %v; want %q", c.version, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "v1.2.3", "1.2", "1.2.3-foo", "1.2.3-rc1.2", "1.2.3+", "1.2.3+a_b"} {
		if v, err := PythonVersion(bad); err == nil {
			t.Errorf("PythonVersion(%q) = %q, want an error", bad, v)
		}
	}
}

// Every version ReleaseVersion makes has a Python form: dist never fails on it.
func TestPythonVersionOfReleases(t *testing.T) {
	for _, d := range []string{"v1.2.3", "v1.2.3-4-gabcdef-dirty", "v1.2.3-rc1-2-gabcdef", "214eb05a4eff-dirty"} {
		v, err := ReleaseVersion(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := PythonVersion(v); err != nil {
			t.Errorf("describe %q: %v", d, err)
		}
	}
}

package lab

import "testing"

// The version lines are what Debian's QEMU packages print (bookworm 7.2, bookworm-backports
// 10.0); the os-release texts are bookworm's and trixie's.
func TestParseQEMUVersion(t *testing.T) {
	for _, c := range []struct {
		out       string
		want      qemuVersion
		ok        bool
		newEnough bool // at least minQEMU
	}{
		{"QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright (c) 2003-2022 Fabrice Bellard and the QEMU Project developers\n", qemuVersion{7, 2}, true, false},
		{"QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright (c) 2003-2025 Fabrice Bellard and the QEMU Project developers\n", qemuVersion{10, 0}, true, true},
		{"QEMU emulator version 8.0.0\n", qemuVersion{8, 0}, true, true},
		{"QEMU emulator version 7.10.1\n", qemuVersion{7, 10}, true, false},
		{"qemu-system-x86_64: unknown option\n", qemuVersion{}, false, false},
		{"", qemuVersion{}, false, false},
	} {
		got, ok := parseQEMUVersion(c.out)
		if got != c.want || ok != c.ok {
			t.Errorf("parseQEMUVersion(%q) = %v, %v; want %v, %v", c.out, got, ok, c.want, c.ok)
		}
		if ok && got.atLeast(minQEMU) != c.newEnough {
			t.Errorf("%v.atLeast(%v) = %v, want %v", got, minQEMU, !c.newEnough, c.newEnough)
		}
	}
}

func TestOSCodename(t *testing.T) {
	bookworm := `PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
`
	trixie := "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\nVERSION_CODENAME=\"trixie\"\nID=debian\n"
	for _, c := range []struct{ text, want string }{
		{bookworm, "bookworm"},
		{trixie, "trixie"},
		{"NAME=\"Arch Linux\"\nID=arch\n", ""},
		{"", ""},
	} {
		if got := osCodename(c.text); got != c.want {
			t.Errorf("osCodename(%q) = %q, want %q", c.text, got, c.want)
		}
	}
}

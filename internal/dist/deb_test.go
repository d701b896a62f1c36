package dist

import (
	"strings"
	"testing"
)

func TestControl(t *testing.T) {
	p := Package{Name: "libnccl-net-mpib", Version: "1.2.3+4.gabc", Architecture: "amd64", MultiArchSame: true,
		Maintainer: "M <m@x>", Section: "libs", Depends: "libc6 (>= 2.28), libibverbs1", InstalledKiB: 3402,
		Summary: "MPIB plugin", Description: "First line.\n\nAfter a blank line."}
	got, err := Control(p)
	if err != nil {
		t.Fatal(err)
	}
	want := "Package: libnccl-net-mpib\nVersion: 1.2.3+4.gabc\nArchitecture: amd64\nMulti-Arch: same\n" +
		"Maintainer: M <m@x>\nSection: libs\nPriority: optional\nDepends: libc6 (>= 2.28), libibverbs1\n" +
		"Installed-Size: 3402\nDescription: MPIB plugin\n First line.\n .\n After a blank line.\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	p.Description = ""
	if got, _ := Control(p); !strings.HasSuffix(got, "Description: MPIB plugin\n") {
		t.Fatalf("no long description: got\n%s", got)
	}
}

func TestControlRefuses(t *testing.T) {
	ok := Package{Name: "libnccl-net-mpib", Version: "1.2.3", Architecture: "amd64", Maintainer: "M <m@x>", Summary: "s"}
	for name, mutate := range map[string]func(*Package){
		"upper-case name":    func(p *Package) { p.Name = "LibMPIB" },
		"hyphenated version": func(p *Package) { p.Version = "0.0.0-dev" },
		"two-line summary":   func(p *Package) { p.Summary = "a\nb" },
		"no summary":         func(p *Package) { p.Summary = "" },
		"no architecture":    func(p *Package) { p.Architecture = "" },
	} {
		p := ok
		mutate(&p)
		if _, err := Control(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Control(ok); err != nil {
		t.Fatalf("the valid package was refused: %v", err)
	}
}

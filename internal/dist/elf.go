package dist

import (
	"debug/elf"
	"fmt"
	"io"
)

// ReadNeeds lists what the x86-64 ELF binary r (named name in the needs) asks of the dynamic
// loader: its DT_NEEDED libraries, every version node of .gnu.version_r and every imported
// symbol with its version. A static binary needs nothing. Anything but an x86-64 ELF is an
// error: the release ships for x86-64 only.
func ReadNeeds(name string, r io.ReaderAt) ([]Need, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("%s: not an ELF file: %w", name, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		return nil, fmt.Errorf("%s: %v %v, not x86-64", name, f.Class, f.Machine)
	}
	if f.Section(".dynamic") == nil {
		return nil, nil
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("%s: reading DT_NEEDED: %w", name, err)
	}
	var needs []Need
	for _, l := range libs {
		needs = append(needs, Need{File: name, Library: l})
	}
	if f.Section(".gnu.version_r") != nil {
		vn, err := f.DynamicVersionNeeds()
		if err != nil {
			return nil, fmt.Errorf("%s: reading .gnu.version_r: %w", name, err)
		}
		for _, lib := range vn {
			for _, d := range lib.Needs {
				needs = append(needs, Need{File: name, Library: lib.Name, Version: d.Dep})
			}
		}
	}
	syms, err := f.ImportedSymbols()
	if err != nil {
		return nil, fmt.Errorf("%s: reading imported symbols: %w", name, err)
	}
	for _, s := range syms {
		needs = append(needs, Need{File: name, Symbol: s.Name, Library: s.Library, Version: s.Version})
	}
	return needs, nil
}

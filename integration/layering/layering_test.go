// Package layering checks the lab suite's layering without a lab: feature test files of
// package integration use the harness and their own helpers, never another feature file's.
// A helper two feature files need belongs in a harness file. The check runs with the unit
// tests (package integration itself boots the lab in TestMain, so it cannot hold it).
package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// harnessFiles are the files of package integration that feature files may use: the lab and
// its topology (harness.go, topology.go, mesh.go), the nodes and their processes (node.go,
// runner.go), perftest runs (perftest.go), TestMain and labOrSkip (main_test.go), the nettest
// pair runner (harness_pair_test.go), lab faults and their restore (harness_fault_test.go),
// the plugin environment builder (harness_env_test.go), evidence lines and the parsers of the
// plugin's and the driver's lines (harness_evidence_test.go), the agents' CLIs and gates
// (harness_agent_test.go), mesh ports and counters (harness_mesh_test.go), the benchmarks'
// figures (harness_bench_test.go) and the plugins they drive, MPIB and net_ib's port
// (harness_netib_test.go). Every other file is a feature file.
var harnessFiles = []string{
	"harness.go",
	"node.go",
	"runner.go",
	"topology.go",
	"mesh.go",
	"perftest.go",
	"main_test.go",
	"harness_pair_test.go",
	"harness_fault_test.go",
	"harness_env_test.go",
	"harness_evidence_test.go",
	"harness_agent_test.go",
	"harness_mesh_test.go",
	"harness_bench_test.go",
	"harness_netib_test.go",
}

// decls is what one file declares at package level.
type decls struct {
	names   map[string]bool // functions, types, variables, constants
	methods map[string]bool // "Type.Method"
	types   map[string]bool
}

func declsOf(f *ast.File) decls {
	d := decls{names: map[string]bool{}, methods: map[string]bool{}, types: map[string]bool{}}
	for _, decl := range f.Decls {
		switch x := decl.(type) {
		case *ast.FuncDecl:
			if x.Recv == nil {
				d.names[x.Name.Name] = true
			} else {
				d.methods[recvType(x)+"."+x.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range x.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					d.names[s.Name.Name] = true
					d.types[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.Name != "_" {
							d.names[n.Name] = true
						}
					}
				}
			}
		}
	}
	return d
}

// recvType is a method's receiver type name without pointer or type parameters.
func recvType(fd *ast.FuncDecl) string {
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// uses returns the package-level names a file refers to but does not declare: identifiers
// its own scopes leave unresolved, less selected fields and methods, method declarations'
// names and keyed-literal field names.
func uses(f *ast.File) map[string][]token.Pos {
	skip := map[*ast.Ident]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.SelectorExpr:
			skip[x.Sel] = true
		case *ast.FuncDecl:
			skip[x.Name] = true // a method's name is not a use
		case *ast.CompositeLit:
			for _, e := range x.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					if id, ok := kv.Key.(*ast.Ident); ok {
						skip[id] = true
					}
				}
			}
		}
		return true
	})
	out := map[string][]token.Pos{}
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Obj == nil && !skip[id] {
			out[id.Name] = append(out[id.Name], id.Pos())
		}
		return true
	})
	return out
}

// violations lists, for the Go files in dir, every use of one feature file's declaration by
// another or by a harness file, and every method a feature file declares on a type it does not
// declare itself.
func violations(t *testing.T, dir string, harness []string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	for _, p := range paths {
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = f
	}
	feature := map[string]decls{}
	for name, f := range files {
		if !slices.Contains(harness, name) {
			feature[name] = declsOf(f)
		}
	}
	var bad []string
	for name, f := range files {
		if _, ok := feature[name]; ok {
			continue
		}
		for used, at := range uses(f) {
			for name2, d2 := range feature {
				if d2.names[used] {
					bad = append(bad, fset.Position(at[0]).String()+": harness file "+name+" uses "+used+" of "+name2)
				}
			}
		}
	}
	for name, d := range feature {
		for name2, d2 := range feature {
			if name2 == name {
				continue
			}
			for used, at := range uses(files[name]) {
				if d2.names[used] {
					bad = append(bad, fset.Position(at[0]).String()+": "+name+" uses "+used+" of "+name2)
				}
			}
		}
		for m := range d.methods {
			if typ, _, _ := strings.Cut(m, "."); !d.types[typ] {
				bad = append(bad, name+": method "+m+" on a type the file does not declare (methods of shared types belong in the harness)")
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// TestFeatureFilesUseOnlyTheHarness is the rule for package integration.
func TestFeatureFilesUseOnlyTheHarness(t *testing.T) {
	for _, h := range harnessFiles {
		if _, err := os.Stat(filepath.Join("..", h)); err != nil {
			t.Errorf("harness file %s: %v", h, err)
		}
	}
	for _, v := range violations(t, "..", harnessFiles) {
		t.Error(v)
	}
}

// TestViolationsFound proves the check can fail: a feature file calling another's helper, a
// harness file calling a feature file's, and a feature file adding a method to a type
// declared elsewhere.
func TestViolationsFound(t *testing.T) {
	dir := t.TempDir()
	for name, src := range map[string]string{
		"h.go":      "package p\ntype Node struct{}\nfunc shared() { useB() }\n",
		"a_test.go": "package p\nfunc helperA() int { shared(); return 1 }\nfunc (Node) extra() {}\n",
		"b_test.go": "package p\ntype s2 struct{}\nfunc (s2) helperA() {}\nfunc useB() { helperA := 2; _ = helperA }\nfunc useC() { _ = helperA() }\ntype s struct{ helperA int }\nfunc lit() { _ = s{helperA: 1} }\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := violations(t, dir, []string{"h.go"})
	want := []string{"b_test.go:5:19: b_test.go uses helperA of a_test.go", "h.go:3:17: harness file h.go uses useB of b_test.go", "a_test.go: method Node.extra on a type the file does not declare"}
	if len(got) != len(want) {
		t.Fatalf("violations = %q, want %d of them", got, len(want))
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, w) }) {
			t.Errorf("violations = %q, want one containing %q", got, w)
		}
	}
}

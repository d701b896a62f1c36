package layers

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// layers is mpib-nettest's structure, lowest layer first, as nettest.h lists it: every .c
// and .h file of plugin/nettest in exactly one layer. A file may use (call, take the address
// of, or read) the functions and extern variables of its own module and of lower layers only,
// so the files of one layer never use each other: code that two modes share lives below them.
// A header and its .c file are one module (nt_X.h declares X.c).
var layers = []layer{
	{"base: options, time, output, watchdog, parsing, names, buffers, forks", []string{"nettest.h", "nt_util.h", "util.c"}},
	{"the plugin's table and the side channel", []string{"nt_net.h", "net.c", "nt_oob.h", "oob.c"}},
	{"connection setup and the transfer engine", []string{"nt_conn.h", "conn.c", "nt_xfer.h", "xfer.c"}},
	{"what the data modes share", []string{"nt_data.h", "data.c"}},
	{"modes", []string{"nt_modes.h", "modes.c", "badinput.c", "lifecycle.c", "hostile.c", "silent.c", "scale.c", "sniff.c"}},
	{"options and dispatch", []string{"main.c"}},
}

type layer struct {
	name  string
	files []string
}

// srcDir is mpib-nettest's sources, relative to this package.
const srcDir = ".."

// TestLayers fails when a file of plugin/nettest uses a function or extern variable of its
// own layer or of a higher one, includes a higher layer's header, or is in no layer. With -v
// it prints the graph: which file uses what of which other.
func TestLayers(t *testing.T) {
	srcs, err := readSources(srcDir)
	if err != nil {
		t.Fatal(err)
	}
	bad, a := check(srcs, layers)
	for _, b := range bad {
		t.Error(b)
	}
	for _, e := range a.edges {
		t.Logf("%s -> %s: %s", e.from, e.to, strings.Join(e.names, " "))
	}
}

// check returns what breaks the layering of srcs (file name: text) under table, and the
// analysis it judged.
func check(srcs map[string]string, table []layer) ([]string, analysis) {
	var bad []string
	layerOf, moduleLayer := map[string]int{}, map[string]int{}
	for i, l := range table {
		for _, f := range l.files {
			if _, dup := layerOf[f]; dup {
				bad = append(bad, fmt.Sprintf("%s is listed twice in the layer table", f))
			}
			if m, ok := moduleLayer[moduleOf(f)]; ok && m != i {
				bad = append(bad, fmt.Sprintf("%s is not in the layer of its module %s", f, moduleOf(f)))
			}
			layerOf[f] = i
			moduleLayer[moduleOf(f)] = i
		}
	}
	names := make([]string, 0, len(srcs))
	for f := range srcs {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if _, ok := layerOf[f]; !ok {
			bad = append(bad, fmt.Sprintf("%s is in no layer: add it to the table in layers_test.go", f))
		}
	}
	for _, l := range table {
		for _, f := range l.files {
			if _, ok := srcs[f]; !ok {
				bad = append(bad, fmt.Sprintf("the layer table lists %s, which is not there", f))
			}
		}
	}
	a := analyze(srcs)
	bad = append(bad, a.problems...)
	for _, e := range a.edges {
		from, okf := moduleLayer[moduleOf(e.from)]
		to, okt := moduleLayer[moduleOf(e.to)]
		if okf && okt && to >= from {
			bad = append(bad, fmt.Sprintf("%s (layer %d, %s) uses %s of %s (layer %d, %s): a file uses only its own "+
				"module and lower layers", e.from, from+1, table[from].name, strings.Join(e.names, ", "), e.to, to+1,
				table[to].name))
		}
	}
	for _, inc := range a.includes {
		l, okh := layerOf[inc.header]
		from, okf := layerOf[inc.from]
		if okh && okf && l > from {
			bad = append(bad, fmt.Sprintf("%s (layer %d) includes %s of layer %d", inc.from, from+1, inc.header, l+1))
		}
	}
	return bad, a
}

// TestAnalyzer checks the checker on small sources: calls, references without a call, static
// names that shadow another file's, what comments, strings, macros and members hide, and the
// verdicts on uses down, up and within a layer.
func TestAnalyzer(t *testing.T) {
	srcs := map[string]string{
		"nt_b.h": "extern int nt_b_count;\nvoid nt_b(void);\nstatic inline int nt_b_inline(int x) { return x + nt_c(); }\n",
		"b.c":    "#include \"nt_b.h\"\nint nt_b_count;\nvoid nt_b(void) { nt_b_count++; }\nstatic void nt_helper(void) {}\n",
		"c.c": "#define NT_C_MACRO(x) \\\n  (x)\nint nt_c(void) __attribute__((unused));\n" +
			"static const struct { int a; } nt_table[] = {{1}, {2}};\nint nt_c(void) { return nt_table[0].a; }\n",
		"a.c": "#include \"nt_b.h\"\n" +
			"/* nt_c() in a comment */\n" +
			"static void nt_helper(void) { puts(\"nt_c()\"); }\n" +
			"struct nt_c;\n" +
			"static int nt_a(struct nt_c *p) {\n  nt_helper();\n  void (*f)(void) = nt_b;\n  f();\n" +
			"  return p->nt_c + x.nt_c + nt_b_count + nt_b_inline(1);\n}\n",
	}
	bad, a := check(srcs, []layer{{"c", []string{"c.c"}}, {"b", []string{"nt_b.h", "b.c"}}, {"a", []string{"a.c"}}})
	if len(bad) != 0 {
		t.Errorf("a layering that holds: %q", bad)
	}
	got := map[string]string{}
	for _, e := range a.edges {
		got[e.from+" -> "+e.to] = strings.Join(e.names, " ")
	}
	want := map[string]string{
		"a.c -> b.c":    "nt_b nt_b_count nt_b_inline",
		"nt_b.h -> c.c": "nt_c",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("edges:\n got %v\nwant %v", got, want)
	}
	if len(a.includes) != 2 || a.includes[0] != (include{"a.c", "nt_b.h"}) {
		t.Errorf("includes: %+v", a.includes)
	}
	for _, tc := range []struct {
		name  string
		table []layer
		want  []string // each problem's beginning, in order
	}{
		{"b above a", []layer{{"c", []string{"c.c"}}, {"a", []string{"a.c"}}, {"b", []string{"nt_b.h", "b.c"}}},
			[]string{"a.c (layer 2, a) uses nt_b, nt_b_count, nt_b_inline of b.c (layer 3, b)",
				"a.c (layer 2) includes nt_b.h of layer 3"}},
		{"a and b in one layer", []layer{{"c", []string{"c.c"}}, {"ab", []string{"a.c", "nt_b.h", "b.c"}}},
			[]string{"a.c (layer 2, ab) uses nt_b, nt_b_count, nt_b_inline of b.c (layer 2, ab)"}},
		{"c in no layer", []layer{{"b", []string{"nt_b.h", "b.c"}}, {"a", []string{"a.c"}}},
			[]string{"c.c is in no layer"}},
	} {
		bad, _ := check(srcs, tc.table)
		if len(bad) != len(tc.want) {
			t.Errorf("%s: %d problems, want %d: %q", tc.name, len(bad), len(tc.want), bad)
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(bad[i], w) {
				t.Errorf("%s: problem %d is %q, want %q...", tc.name, i, bad[i], w)
			}
		}
	}
}

// moduleOf names a file's module: X.c and its header nt_X.h are module X.
func moduleOf(file string) string {
	if strings.HasSuffix(file, ".h") {
		return strings.TrimPrefix(strings.TrimSuffix(file, ".h"), "nt_")
	}
	return strings.TrimSuffix(file, ".c")
}

func readSources(dir string) (map[string]string, error) {
	srcs := map[string]string{}
	for _, pat := range []string{"*.c", "*.h"} {
		files, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, err
			}
			srcs[filepath.Base(f)] = string(b)
		}
	}
	if len(srcs) == 0 {
		return nil, fmt.Errorf("no C sources in %s", dir)
	}
	return srcs, nil
}

// edge: file `from` uses `names`, defined in module `to` (another module; named by its .c
// file, or by its header when it has none).
type edge struct {
	from, to string
	names    []string
}

type include struct{ from, header string }

type analysis struct {
	edges    []edge
	includes []include
	problems []string
}

type def struct {
	file   string
	static bool
}

// analyze finds the functions each file defines (every top-level `name(...) {`, and in
// headers the static inline ones), the extern variables the headers declare, and every use
// of those names in another module: .c files in full, headers in their inline bodies. A use
// resolves to the file's own static definition first, else to the non-static one.
func analyze(srcs map[string]string) analysis {
	var a analysis
	toks := map[string][]token{}
	bodies := map[string][][2]int{} // header: token ranges of its inline function bodies
	defs := map[string][]def{}
	files := make([]string, 0, len(srcs))
	for f := range srcs {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		clean, code, incs := stripC(srcs[f])
		for _, h := range incs {
			a.includes = append(a.includes, include{f, h})
		}
		codeToks := tokenize(code)
		fns, vars, spans := topLevel(codeToks)
		toks[f] = tokenize(clean) // a .c file's macros use functions too
		if strings.HasSuffix(f, ".h") {
			toks[f] = codeToks // a header uses names only in its inline bodies
		}
		for _, fn := range fns {
			// A header's static inline function is its module's, in every file that includes it.
			defs[fn.name] = append(defs[fn.name], def{f, fn.static && !strings.HasSuffix(f, ".h")})
		}
		if strings.HasSuffix(f, ".h") {
			for _, v := range vars {
				defs[v] = append(defs[v], def{f, false})
			}
			bodies[f] = spans
		}
	}
	for name, ds := range defs {
		var public []string
		for _, d := range ds {
			if !d.static {
				public = append(public, d.file)
			}
		}
		// A variable declared extern in nt_X.h and defined in X.c is one module's.
		mods := map[string]bool{}
		for _, f := range public {
			mods[moduleOf(f)] = true
		}
		if len(mods) > 1 {
			a.problems = append(a.problems, fmt.Sprintf("%s is defined in several modules: %v", name, public))
		}
	}
	uses := map[[2]string]map[string]bool{}
	for _, f := range files {
		ts := toks[f]
		ranges := [][2]int{{0, len(ts)}}
		if strings.HasSuffix(f, ".h") {
			ranges = bodies[f]
		}
		for _, r := range ranges {
			for i := r[0]; i < r[1]; i++ {
				tk := ts[i]
				if !tk.ident || defs[tk.text] == nil {
					continue
				}
				if i > 0 && (ts[i-1].text == "." || ts[i-1].text == "->" || ts[i-1].text == "struct" ||
					ts[i-1].text == "enum" || ts[i-1].text == "union") {
					continue
				}
				to := resolve(defs[tk.text], f)
				if to == "" || moduleOf(to) == moduleOf(f) {
					continue
				}
				if _, ok := srcs[moduleOf(to)+".c"]; ok {
					to = moduleOf(to) + ".c" // the module, named by its .c file
				}
				k := [2]string{f, to}
				if uses[k] == nil {
					uses[k] = map[string]bool{}
				}
				uses[k][tk.text] = true
			}
		}
	}
	for k, names := range uses {
		e := edge{from: k[0], to: k[1]}
		for n := range names {
			e.names = append(e.names, n)
		}
		sort.Strings(e.names)
		a.edges = append(a.edges, e)
	}
	sort.Slice(a.edges, func(i, j int) bool {
		if a.edges[i].from != a.edges[j].from {
			return a.edges[i].from < a.edges[j].from
		}
		return a.edges[i].to < a.edges[j].to
	})
	return a
}

// resolve: the file that a use of a name in file `from` refers to ("" for none).
func resolve(ds []def, from string) string {
	for _, d := range ds {
		if d.file == from || (d.static && moduleOf(d.file) == moduleOf(from)) {
			return d.file
		}
	}
	// The module's .c file holds the definition; its header only the declaration.
	best := ""
	for _, d := range ds {
		if !d.static && (best == "" || strings.HasSuffix(d.file, ".c")) {
			best = d.file
		}
	}
	return best
}

// stripC blanks comments, string and character literals (newlines kept): clean. code is
// clean with its preprocessor lines blanked too. incs: the headers of #include "..." lines.
func stripC(s string) (clean, code string, incs []string) {
	for _, line := range strings.Split(s, "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "#") {
			l = strings.TrimSpace(strings.TrimPrefix(l, "#"))
			if rest, ok := strings.CutPrefix(l, "include"); ok {
				rest = strings.TrimSpace(rest)
				if strings.HasPrefix(rest, "\"") {
					if end := strings.IndexByte(rest[1:], '"'); end >= 0 {
						incs = append(incs, rest[1:1+end])
					}
				}
			}
		}
	}
	b := []byte(s)
	out := make([]byte, len(b))
	copy(out, b)
	blank := func(i int) {
		if out[i] != '\n' {
			out[i] = ' '
		}
	}
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '/' && i+1 < len(b) && b[i+1] == '*':
			j := i + 2
			for j+1 < len(b) && !(b[j] == '*' && b[j+1] == '/') {
				j++
			}
			end := min(j+2, len(b))
			for k := i; k < end; k++ {
				blank(k)
			}
			i = end - 1
		case b[i] == '/' && i+1 < len(b) && b[i+1] == '/':
			j := i
			for j < len(b) && b[j] != '\n' {
				blank(j)
				j++
			}
			i = j - 1
		case b[i] == '"' || b[i] == '\'':
			q := b[i]
			j := i + 1
			for j < len(b) && b[j] != q && b[j] != '\n' {
				if b[j] == '\\' {
					blank(j)
					j++
				}
				if j < len(b) {
					blank(j)
				}
				j++
			}
			i = j
		}
	}
	lines := strings.Split(string(out), "\n")
	for i, cont := 0, false; i < len(lines); i++ {
		l := lines[i]
		if cont || strings.HasPrefix(strings.TrimSpace(l), "#") {
			cont = strings.HasSuffix(strings.TrimRight(l, " \t"), "\\")
			lines[i] = ""
		}
	}
	return string(out), strings.Join(lines, "\n"), incs
}

type token struct {
	text  string
	ident bool
}

func tokenize(s string) []token {
	var ts []token
	isIdent := func(c byte) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\\':
			i++
		case isIdent(c):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			ts = append(ts, token{s[i:j], !(c >= '0' && c <= '9')})
			i = j
		case c == '-' && i+1 < len(s) && s[i+1] == '>':
			ts = append(ts, token{"->", false})
			i += 2
		default:
			ts = append(ts, token{string(c), false})
			i++
		}
	}
	return ts
}

type fnDef struct {
	name   string
	static bool
}

// topLevel walks the file scope of code without preprocessor lines: function definitions
// (an identifier, its parameter list, optional __attribute__((...)), then a body) with whether
// `static` was among their specifiers, extern variable declarations, and the token ranges of
// the function bodies.
func topLevel(ts []token) (fns []fnDef, vars []string, bodies [][2]int) {
	start := 0 // first token of the current top-level declaration
	for i := 0; i < len(ts); i++ {
		switch ts[i].text {
		case ";":
			if ts[start].text == "extern" {
				if v := externVar(ts[start:i]); v != "" {
					vars = append(vars, v)
				}
			}
			start = i + 1
		case "{":
			end := match(ts, i, "{", "}")
			if name, ok := fnName(ts[start:i]); ok {
				static := false
				for _, t := range ts[start:i] {
					static = static || t.text == "static"
				}
				fns = append(fns, fnDef{name, static})
				bodies = append(bodies, [2]int{i, end})
				start = end + 1
			} // else an aggregate or an initializer: its declaration ends at a `;`
			i = end
		}
	}
	return fns, vars, bodies
}

// match returns the index of the bracket closing the one at i.
func match(ts []token, i int, open, close string) int {
	depth := 0
	for j := i; j < len(ts); j++ {
		switch ts[j].text {
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return len(ts) - 1
}

// fnName: decl is the tokens before a `{` at file scope. It is a function definition when it
// ends with `name ( ... )`, optionally followed by __attribute__ ( ( ... ) ).
func fnName(decl []token) (string, bool) {
	n := len(decl)
	if n < 3 || decl[n-1].text != ")" {
		return "", false
	}
	open := func(close int) int { // the `(` matching decl[close]
		depth := 0
		for j := close; j >= 0; j-- {
			switch decl[j].text {
			case ")":
				depth++
			case "(":
				depth--
				if depth == 0 {
					return j
				}
			}
		}
		return -1
	}
	o := open(n - 1)
	if o >= 1 && decl[o-1].text == "__attribute__" {
		n = o - 1
		if n < 3 || decl[n-1].text != ")" {
			return "", false
		}
		o = open(n - 1)
	}
	if o < 1 || !decl[o-1].ident || decl[o-1].text == "__attribute__" {
		return "", false
	}
	for _, t := range decl[:o-1] {
		if t.text == "=" {
			return "", false
		}
	}
	return decl[o-1].text, true
}

// externVar: the name an `extern ... name;` or `extern ... name[...];` declares ("" for a
// function's prototype).
func externVar(decl []token) string {
	name := ""
	for _, t := range decl {
		if t.text == "(" {
			return ""
		}
		if t.text == "[" {
			break
		}
		if t.ident {
			name = t.text
		}
	}
	return name
}

package yaegistress

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/internal/testkit/traefikbin"
)

// TestCoreAndPluginStayInTheSafeSubset checks the source of core and the
// plugin (non-test files) for the constructs that Yaegi v0.16.1 runs wrongly,
// concurrently or not (see README.md and the probes that reproduce each).
// It is a syntactic check: the stress tests remain the real guard, and the
// two rules that need types (a struct literal stored in an interface-typed
// field, a compiled value returned as an interpreted interface) are
// approximated.
func TestCoreAndPluginStayInTheSafeSubset(t *testing.T) {
	root := repoRoot(t)
	var found []string
	pkgs, err := traefikbin.PluginPackages()
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range pkgs {
		files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(pkg), "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		var parsed []*ast.File
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			parsed = append(parsed, file)
		}
		ifaces := interfaceTypes(parsed)
		for _, file := range parsed {
			for _, v := range unsafeConstructs(file, ifaces) {
				p := fset.Position(v.pos)
				rel, _ := filepath.Rel(root, p.Filename)
				found = append(found, fmt.Sprintf("%s:%d: %s", rel, p.Line, v.why))
			}
		}
	}
	sort.Strings(found)
	for _, f := range found {
		t.Error(f)
	}
}

// violation is one unsafe construct.
type violation struct {
	pos token.Pos
	why string
}

// interfaceTypes returns the names of the interface types the package
// declares (interpreted interfaces under Yaegi).
func interfaceTypes(files []*ast.File) map[string]bool {
	out := map[string]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if _, ok := ts.Type.(*ast.InterfaceType); ok {
					out[ts.Name.Name] = true
				}
			}
			return true
		})
	}
	return out
}

// unsafeConstructs lists the constructs of file that Yaegi v0.16.1 gets
// wrong. ifaces are the package's interface type names.
func unsafeConstructs(file *ast.File, ifaces map[string]bool) []violation {
	imports := map[string]bool{}
	for _, imp := range file.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		imports[name] = true
	}
	var out []violation
	add := func(n ast.Node, why string) { out = append(out, violation{n.Pos(), why}) }
	// A func literal anywhere inside a loop, reported once.
	inLoop := map[token.Pos]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		var body *ast.BlockStmt
		switch n := n.(type) {
		case *ast.ForStmt:
			body = n.Body
		case *ast.RangeStmt:
			body = n.Body
		default:
			return true
		}
		ast.Inspect(body, func(m ast.Node) bool {
			if lit, ok := m.(*ast.FuncLit); ok && !inLoop[lit.Pos()] {
				inLoop[lit.Pos()] = true
				add(lit, "func literal inside a loop: Yaegi's closure slot write-back races with its re-creation (stale or nil closures); call a named function")
			}
			return true
		})
		return true
	})
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			checkReturns(n, ifaces, imports, add)
		case *ast.SelectStmt:
			add(n, "select: concurrent invocations share its cases (wrong answers, hangs); use one event channel and plain receives")
		case *ast.SwitchStmt:
			if n.Tag == nil {
				for _, c := range n.Body.List {
					if cc, ok := c.(*ast.CaseClause); ok && len(cc.List) > 1 {
						add(cc, "tagless switch with a case list: only the first condition is tested; one condition per case, or join them with ||")
					}
				}
			}
		case *ast.ReturnStmt:
			for i, r := range n.Results {
				if u, ok := r.(*ast.UnaryExpr); ok && u.Op == token.ARROW {
					add(n, "return <-ch panics; receive into a variable first")
				}
				if i > 0 && isBuiltinCall(r, "len", "cap") {
					add(n, "len/cap as a later result of a multi-value return lands in the wrong result; use a variable")
				}
			}
		case *ast.AssignStmt:
			if n.Tok == token.ASSIGN && len(n.Lhs) > 1 && len(n.Rhs) == 1 {
				if _, ok := n.Rhs[0].(*ast.CallExpr); ok {
					for _, l := range n.Lhs {
						if _, ok := l.(*ast.SelectorExpr); ok {
							add(n, "a call's results assigned straight to fields (CONTRIBUTING: multi-value results to locals first); assign them to locals, then the fields")
							break
						}
					}
				}
			}
			if n.Tok == token.ASSIGN && len(n.Lhs) > 1 && len(n.Rhs) > 1 {
				for _, r := range n.Rhs {
					if _, ok := r.(*ast.CallExpr); ok {
						add(n, "multi-value = assignment with a call on the right loses or corrupts values; assign one per statement")
						break
					}
				}
			}
			if n.Tok == token.ASSIGN {
				for i, l := range n.Lhs {
					if _, ok := l.(*ast.SelectorExpr); !ok || i >= len(n.Rhs) {
						continue
					}
					if lit, ok := n.Rhs[i].(*ast.CompositeLit); ok && isNamedType(lit.Type) {
						add(n, "struct literal assigned to a field: panics if the field is an interface; go through a variable of the field's type")
					}
				}
			}
		case *ast.CallExpr:
			if isBuiltinCall(n, "recover") {
				add(n, "recover() returns an interpreter value, not the panic value")
			}
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "As" {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "errors" {
					add(n, "errors.As cannot see interpreted error types; use a type assertion")
				}
			}
		case *ast.ValueSpec:
			if n.Type != nil {
				for _, v := range n.Values {
					if _, ok := v.(*ast.BinaryExpr); ok && mentionsIota(v) {
						add(n, "typed constant `T = iota + k` compares unequal to equal values; give explicit values")
					}
				}
			}
		}
		return true
	})
	return out
}

// checkReturns flags returns of a compiled package's call result directly
// as one of the package's (interpreted) interface types.
func checkReturns(fn *ast.FuncDecl, ifaces, imports map[string]bool, add func(ast.Node, string)) {
	if fn.Type.Results == nil || fn.Body == nil {
		return
	}
	var resultIface []bool
	for _, f := range fn.Type.Results.List {
		id, ok := f.Type.(*ast.Ident)
		isIface := ok && ifaces[id.Name]
		n := len(f.Names)
		if n == 0 {
			n = 1
		}
		for i := 0; i < n; i++ {
			resultIface = append(resultIface, isIface)
		}
	}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if _, ok := n.(*ast.FuncLit); ok {
			return false // its returns belong to the literal
		}
		ret, ok := n.(*ast.ReturnStmt)
		if !ok || len(ret.Results) != len(resultIface) {
			return true
		}
		for i, r := range ret.Results {
			call, ok := r.(*ast.CallExpr)
			if !ok || !resultIface[i] {
				continue
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && imports[x.Name] {
					add(ret, "compiled value returned directly as an interpreted interface: comparing it with nil panics; assign it to a variable of the interface type first")
				}
			}
		}
		return true
	})
}

// isNamedType reports whether a composite literal's type is a named type
// (T or pkg.T), which may be a struct, rather than a slice, map or array
// literal.
func isNamedType(e ast.Expr) bool {
	switch e.(type) {
	case *ast.Ident, *ast.SelectorExpr:
		return true
	}
	return false
}

// isBuiltinCall reports whether e calls one of the named builtins.
func isBuiltinCall(e ast.Expr, names ...string) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	id, ok := call.Fun.(*ast.Ident)
	if !ok {
		return false
	}
	for _, n := range names {
		if id.Name == n {
			return true
		}
	}
	return false
}

// mentionsIota reports whether e uses iota.
func mentionsIota(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == "iota" {
			found = true
		}
		return !found
	})
	return found
}

// TestSubsetCheckerFindsTheProbes checks the checker itself: it must flag
// every kind of construct in probe/unsafe.go (the reproductions) and none
// in probe/safe.go (the constructs core uses).
func TestSubsetCheckerFindsTheProbes(t *testing.T) {
	check := func(name string) []violation {
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, filepath.Join("probe", name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		return unsafeConstructs(file, interfaceTypes([]*ast.File{file}))
	}
	kinds := map[string]bool{}
	for _, v := range check("unsafe.go") {
		kinds[strings.SplitN(v.why, ":", 2)[0]] = true
	}
	for _, want := range []string{
		"select",
		"return <-ch panics; receive into a variable first",
		"multi-value = assignment with a call on the right loses or corrupts values; assign one per statement",
		"errors.As cannot see interpreted error types; use a type assertion",
		"recover() returns an interpreter value, not the panic value",
		"len/cap as a later result of a multi-value return lands in the wrong result; use a variable",
		"struct literal assigned to a field",
		"compiled value returned directly as an interpreted interface",
		"typed constant `T = iota + k` compares unequal to equal values; give explicit values",
		"func literal inside a loop",
		"tagless switch with a case list",
	} {
		if !kinds[want] {
			t.Errorf("the checker missed %q in probe/unsafe.go (found %v)", want, kinds)
		}
	}
	for _, v := range check("safe.go") {
		t.Errorf("the checker flags the safe probes: %s", v.why)
	}
}

package workers_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/workers"
)

// module is this module's path; ourPackages are the packages a reconciler's
// own files live in.
const module = "github.com/flowfabric/ffreconcile/"

var ourPackages = []string{"jobs", "store", "workers", "migrations"}

// notProduction are the directories and files that are not the fleet's
// production code: benchmarks, the demo feed and test support, which name
// reconcilers to exercise them.
var notProduction = []string{
	"internal/bench/", "internal/demo/", "internal/fftest/", "internal/ffseed/", "internal/ffread/",
	"internal/testdb/", "internal/fleettest/", "internal/chaostest/", "internal/cmd/",
	"cmd/worker/bench.go", "cmd/worker/demo.go",
}

// namedElsewhereAtMost: the one production file outside its own files and
// the registry that may name a reconciler (the promote CLI names delayed
// promotion: `worker promote` enqueues its row job).
var namedElsewhereAtMost = map[string]string{"delayed_promotion": "cmd/worker/promote.go"}

// TestEveryReconcilerIsNamedOnlyInItsOwnFiles: a reconciler's whole
// definition lives in its own files (jobs|store|workers|migrations/
// <name>.go) and its registry line. Everything its own files declare is
// referred to, in the fleet's production code, only from those files and
// workers/registry.go; the rest of the program walks the registry. A
// regression shows as a file that names a reconciler's args, Due, setting,
// worker or migration (a new reconciler would then cost an edit there too),
// listed with the names it uses.
func TestEveryReconcilerIsNamedOnlyInItsOwnFiles(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{} // module-relative path → parsed file
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files[rel] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	for _, r := range workers.All() {
		own := map[string]bool{"workers/registry.go": true}
		declared := map[string]map[string]bool{} // package → names its own files declare
		for _, pkg := range ourPackages {
			path := pkg + "/" + r.Name + ".go"
			f, ok := files[path]
			if !ok {
				continue
			}
			own[path] = true
			declared[pkg] = topLevelNames(f)
		}
		if len(declared) == 0 {
			t.Errorf("reconciler %s has none of its own files", r.Name)
			continue
		}
		var elsewhere []string
		for path, f := range files {
			if own[path] || !production(path) {
				continue
			}
			if names := namesUsed(path, f, declared); len(names) > 0 {
				elsewhere = append(elsewhere, path+" ("+strings.Join(names, ", ")+")")
			}
		}
		slices.Sort(elsewhere)
		allowed := 0
		if ok := namedElsewhereAtMost[r.Name]; ok != "" {
			allowed = 1
			if len(elsewhere) == 1 && !strings.HasPrefix(elsewhere[0], ok+" ") {
				allowed = 0
			}
		}
		if len(elsewhere) > allowed {
			t.Errorf("reconciler %s is named outside its own files and the registry, in %d production files:\n  %s",
				r.Name, len(elsewhere), strings.Join(elsewhere, "\n  "))
		}
	}
}

// production reports whether a module-relative path is the fleet's
// production code.
func production(path string) bool {
	for _, p := range notProduction {
		if strings.HasPrefix(path, p) {
			return false
		}
	}
	return true
}

// topLevelNames returns the names f declares at top level (not methods).
func topLevelNames(f *ast.File) map[string]bool {
	out := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				out[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					out[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						out[n.Name] = true
					}
				}
			}
		}
	}
	return out
}

// namesUsed returns the names of declared (package → names) that the file
// at path refers to: qualified (pkg.Name) from another package, bare from
// the same one.
func namesUsed(path string, f *ast.File, declared map[string]map[string]bool) []string {
	imports := map[string]string{} // local name → our package
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if !strings.HasPrefix(p, module) {
			continue
		}
		pkg := strings.TrimPrefix(p, module)
		local := filepath.Base(pkg)
		if imp.Name != nil {
			local = imp.Name.Name
		}
		imports[local] = pkg
	}
	samePkg := filepath.ToSlash(filepath.Dir(path))
	seen := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok {
				if pkg, ok := imports[x.Name]; ok && declared[pkg][n.Sel.Name] {
					seen[pkg+"."+n.Sel.Name] = true
				}
			}
			if _, ok := n.X.(*ast.Ident); ok {
				return false // the selector's Sel is not a bare name
			}
		case *ast.Ident:
			if declared[samePkg][n.Name] && n.Obj == nil {
				seen[n.Name] = true
			}
		}
		return true
	})
	// A declaration of the same name in this file is its own, not a use.
	for name := range topLevelNames(f) {
		delete(seen, name)
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// TestRegistryFilesExist: the checker above finds a reconciler's files by
// name; a reconciler whose files were renamed would escape it.
func TestRegistryFilesExist(t *testing.T) {
	t.Parallel()
	for _, r := range workers.All() {
		if _, err := os.Stat(filepath.Join("..", "workers", r.Name+".go")); err != nil {
			t.Errorf("reconciler %s: %v", r.Name, err)
		}
	}
}

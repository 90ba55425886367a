// Command apicount prints how many exported identifiers each public package
// of the module declares, and their total: a measure of how much a Go user
// of tollgate has to hold in their head.
//
// It counts top-level exported constants, variables, functions and types,
// plus the exported methods of exported types (struct fields and interface
// methods are not counted). Test files, and packages
// under internal/, cmd/, examples/, bench/ and scripts/, are not counted.
//
// It also refuses an exported name that is only another package's under a
// second name — an alias (type T = pkg.T) or a constant or variable set to
// another package's (const C = pkg.C) — since a concept has one home.
//
//	go run ./scripts/apicount          # per package, then the total
//	go run ./scripts/apicount -max 224 # and fail when the total is above 224
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	max := flag.Int("max", 0, "exit 1 when the total is above this (0: no bound)")
	list := flag.Bool("names", false, "print every name counted, one a line")
	flag.Parse()
	counts, names, aliases, err := count(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(2)
	}
	for _, a := range aliases {
		fmt.Fprintln(os.Stderr, "apicount: an exported name is another package's:", a)
	}
	dirs := make([]string, 0, len(counts))
	total := 0
	for d, n := range counts {
		dirs = append(dirs, d)
		total += n
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		fmt.Printf("%5d  %s\n", counts[d], d)
		if *list {
			sort.Strings(names[d])
			for _, n := range names[d] {
				fmt.Printf("       %s\n", n)
			}
		}
	}
	fmt.Printf("%5d  total exported names\n", total)
	if *max > 0 && total > *max {
		fmt.Fprintf(os.Stderr, "apicount: %d exported names, more than %d\n", total, *max)
		os.Exit(1)
	}
	if len(aliases) > 0 {
		os.Exit(1)
	}
}

// module is the import path whose packages may not be re-exported.
const module = "github.com/tollgate/tollgate"

// skipped are the folders whose packages no Go user imports.
var skipped = map[string]bool{"internal": true, "cmd": true, "examples": true, "bench": true, "scripts": true, "testdata": true}

// count walks root and returns, per package folder, how many exported
// names it declares, and the names; and the exported names that alias
// another package's.
func count(root string) (counts map[string]int, names map[string][]string, aliases []string, err error) {
	counts = map[string]int{}
	names = map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (skipped[d.Name()] || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		got := exported(f)
		counts[dir] += len(got)
		names[dir] = append(names[dir], got...)
		for _, a := range aliased(f) {
			aliases = append(aliases, path+": "+a)
		}
		return nil
	})
	return counts, names, aliases, err
}

// aliased returns the exported names of f that are another tollgate
// package's: type aliases of a qualified type, and constants or variables
// whose value is a qualified identifier of a package of the module.
func aliased(f *ast.File) []string {
	imported := map[string]bool{}
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, `"`)
		if !strings.HasPrefix(p, module+"/") && p != module {
			continue
		}
		name := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		imported[name] = true
	}
	qualified := func(e ast.Expr) (string, bool) {
		if ix, ok := e.(*ast.IndexExpr); ok {
			e = ix.X
		}
		sel, ok := e.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok || !imported[pkg.Name] {
			return "", false
		}
		return pkg.Name + "." + sel.Sel.Name, true
	}
	var out []string
	for _, decl := range f.Decls {
		d, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range d.Specs {
			switch s := spec.(type) {
			case *ast.TypeSpec:
				if q, ok := qualified(s.Type); ok && s.Assign.IsValid() && s.Name.IsExported() {
					out = append(out, "type "+s.Name.Name+" = "+q)
				}
			case *ast.ValueSpec:
				for i, name := range s.Names {
					if i < len(s.Values) && name.IsExported() {
						if q, ok := qualified(s.Values[i]); ok {
							out = append(out, name.Name+" = "+q)
						}
					}
				}
			}
		}
	}
	return out
}

// exported returns the exported top-level names of f and the exported
// methods declared on its exported types (as Type.Method).
func exported(f *ast.File) []string {
	var n []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				n = append(n, d.Name.Name)
			} else if recv, ok := receiver(d.Recv); ok {
				n = append(n, recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						n = append(n, s.Name.Name)
					}
				case *ast.ValueSpec:
					for _, name := range s.Names {
						if name.IsExported() {
							n = append(n, name.Name)
						}
					}
				}
			}
		}
	}
	return n
}

// receiver returns the name of a method's receiver type, and whether that
// type is exported.
func receiver(recv *ast.FieldList) (string, bool) {
	if len(recv.List) == 0 {
		return "", false
	}
	t := recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.Name, x.IsExported()
		default:
			return "", false
		}
	}
}

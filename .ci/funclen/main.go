// funclen prints, for the non-test, non-generated Go files under a
// directory, the number of functions, how many exceed 50 and 100 lines,
// and the longest ones with their cyclomatic complexity.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type fn struct {
	name       string
	lines, cyc int
}

func cyclo(n ast.Node) int {
	c := 1
	ast.Inspect(n, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if x.List != nil {
				c++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

func main() {
	var fns []fn
	fset := token.NewFileSet()
	filepath.Walk(os.Args[1], func(p string, info os.FileInfo, err error) error {
		if err == nil && info.IsDir() && p != os.Args[1] && strings.HasPrefix(info.Name(), ".") {
			return filepath.SkipDir // .ci, .git
		}
		if err != nil || info.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.Contains(p, "_bpfe") || strings.Contains(p, "/examples/") || strings.Contains(p, "/testdata/") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil || (f.Doc != nil && strings.Contains(f.Doc.Text(), "DO NOT EDIT")) {
			return nil
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				t := fd.Recv.List[0].Type
				if s, ok := t.(*ast.StarExpr); ok {
					t = s.X
				}
				if id, ok := t.(*ast.Ident); ok {
					name = id.Name + "." + name
				}
			}
			l := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			fns = append(fns, fn{filepath.Dir(p) + ":" + name, l, cyclo(fd)})
		}
		return nil
	})
	sort.Slice(fns, func(i, j int) bool { return fns[i].lines > fns[j].lines })
	over50, over100 := 0, 0
	for _, f := range fns {
		if f.lines > 50 {
			over50++
		}
		if f.lines > 100 {
			over100++
		}
	}
	fmt.Printf("%d functions, %d over 50 lines, %d over 100\n", len(fns), over50, over100)
	for _, f := range fns {
		fmt.Printf("  %4d lines  cyclo %3d  %s\n", f.lines, f.cyc, f.name)
	}
}

package rsock

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFailureModesDocumented checks FAILURE_MODES.md against the tests: every test it
// names exists, and every fault test of the RDMA engine is listed.
func TestFailureModesDocumented(t *testing.T) {
	doc, err := os.ReadFile("FAILURE_MODES.md")
	require.NoError(t, err)
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z/]+)\\.((?:Test|Fuzz)\\w+)`").FindAllStringSubmatch(string(doc), -1) {
		named[m[1]+"."+m[2]] = true
	}
	require.NotEmpty(t, named)

	dirs := map[string]string{"rsock": ".", "rsock/internal/rdma": "internal/rdma", "flowctl": "../flowctl",
		"verbs": "../verbs", "verbs/ibv": "../verbs/ibv", "verbs/soft": "../verbs/soft",
		"verbs/shm": "../verbs/shm", "verbs/auto": "../verbs/auto"}
	exist := map[string]bool{}
	for pkg, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		require.NoError(t, err)
		for _, f := range files {
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			require.NoError(t, err)
			for _, d := range file.Decls {
				if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
					exist[pkg+"."+fn.Name.Name] = true
				}
			}
		}
	}
	for name := range named {
		require.True(t, exist[name], "FAILURE_MODES.md names %s, which does not exist", name)
	}
	for name := range exist {
		if strings.HasPrefix(name, "rsock/internal/rdma.TestFault") {
			require.True(t, named[name], "%s is not listed in FAILURE_MODES.md", name)
		}
	}
}

package report

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGitCommit builds throw-away checkouts and checks what gitCommit records of each.
func TestGitCommit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is needed to test the commit a report records: %v", err)
	}
	run := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_GLOBAL=/dev/null")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
		return string(out)
	}
	checkout := func(module string) (dir, rev string) {
		dir = t.TempDir()
		run(dir, "init", "-q")
		require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+module+"\n\ngo 1.26\n"), 0o644))
		run(dir, "add", "go.mod")
		run(dir, "commit", "-q", "-m", "first")
		return dir, run(dir, "rev-parse", "HEAD")[:40]
	}

	dir, rev := checkout(modulePath)
	sub := filepath.Join(dir, "benchmarks")
	require.NoError(t, os.Mkdir(sub, 0o755))
	require.Equal(t, rev, gitCommit(dir), "a clean checkout")
	require.Equal(t, rev, gitCommit(sub), "from a directory inside it")
	require.NoError(t, os.WriteFile(filepath.Join(sub, "new.go"), nil, 0o644))
	require.Equal(t, rev, gitCommit(dir), "an untracked file changes nothing measured")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+modulePath+"\n\ngo 1.27\n"), 0o644))
	require.Equal(t, rev+"-dirty", gitCommit(dir), "a changed tracked file")

	other, _ := checkout("example.com/other")
	require.Equal(t, "unknown", gitCommit(other), "another module's checkout")
	require.Equal(t, "unknown", gitCommit(t.TempDir()), "no checkout")
}

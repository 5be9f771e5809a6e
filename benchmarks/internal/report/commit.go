package report

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// modulePath is the module whose commit a report records.
const modulePath = "github.com/rsockio/rsock"

// gitCommit returns the commit of the rsock checkout that dir is in, asking git, with
// "-dirty" when tracked files have changes; or "unknown" when dir is in no git checkout
// of rsock or git is missing. It is what a report records when the binary carries no
// VCS stamp: go run and go test stamp none, and they are how rsockperf is usually run,
// from the checkout being measured.
func gitCommit(dir string) string {
	git := func(args ...string) (string, bool) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err == nil
	}
	top, ok := git("rev-parse", "--show-toplevel")
	if !ok || moduleOf(filepath.Join(top, "go.mod")) != modulePath {
		return "unknown"
	}
	rev, ok := git("rev-parse", "HEAD")
	if !ok || rev == "" {
		return "unknown"
	}
	if status, ok := git("status", "--porcelain", "--untracked-files=no"); !ok || status != "" {
		return rev + "-dirty"
	}
	return rev
}

// moduleOf returns the module path a go.mod file declares, or "".
func moduleOf(gomod string) string {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

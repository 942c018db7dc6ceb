// Package docscheck holds the test that every relative link of the
// repository's Markdown files resolves: the file exists and, for a
// #fragment, the file has a heading with that anchor.
package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// link matches inline Markdown links and images: [text](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

func TestMarkdownLinksResolve(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := markdownFiles(t, root)
	if len(files) < 5 {
		t.Fatalf("found %d Markdown files under %s, want the repository's READMEs", len(files), root)
	}
	checked := 0
	for _, file := range files {
		text := readFile(t, file)
		for _, m := range link.FindAllStringSubmatch(withoutCode(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, fragment, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: %s does not exist", rel(root, file), target, rel(root, dest))
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if !anchors(readFile(t, dest))[fragment] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", rel(root, file), target, rel(root, dest), fragment)
			}
		}
	}
	if checked == 0 {
		t.Fatal("checked 0 relative links, want the READMEs' links between each other")
	}
}

// TestAnchors pins the anchor rule on the headings the READMEs link to.
func TestAnchors(t *testing.T) {
	got := anchors("## Fleet mode: several replicas, one Redis\n### The reference workload\n## How it behaves\n")
	for _, want := range []string{"fleet-mode-several-replicas-one-redis", "the-reference-workload", "how-it-behaves"} {
		if !got[want] {
			t.Errorf("anchors lack %q (have %v)", want, got)
		}
	}
}

func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "plugins-local") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// anchors returns the GitHub-style anchors of a Markdown file's headings:
// lower case, spaces to hyphens, punctuation other than - and _ dropped.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(withoutCode(text), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}

// withoutCode drops fenced code blocks, whose brackets and # lines are not
// links or headings.
func withoutCode(text string) string {
	var b strings.Builder
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}

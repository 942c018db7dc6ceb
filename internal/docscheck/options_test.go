package docscheck

import (
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// TestCoreOptionTableMatchesConfig checks core/config/README.md's option table
// against config.Config: every leaf field of the config has a row, and every
// name in the table's "core field" column is a leaf field.
//
// A struct field (Delay, Budget, Upstreams[]) is not a leaf: the table must
// name its fields one by one, so that a field added to UpstreamConfig, say,
// fails here until the table lists it, rather than hiding behind a row that
// describes its struct whole.
func TestCoreOptionTableMatchesConfig(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fields := configFields(reflect.TypeFor[config.Config](), "")
	listed := map[string]bool{}
	for _, name := range optionTableNames(t, readFile(t, filepath.Join(root, "core/config/README.md"))) {
		listed[name] = true
		leaf, ok := fields[name]
		switch {
		case !ok:
			t.Errorf("core/config/README.md: option table names %s, which is no field of config.Config", name)
		case !leaf:
			t.Errorf("core/config/README.md: option table names %s, a struct: list its fields instead", name)
		}
	}
	for name, leaf := range fields {
		if leaf && !listed[name] {
			t.Errorf("core/config/README.md: option table lacks config.Config field %s", name)
		}
	}
}

// configFields returns the exported fields of struct type typ, recursively,
// as dotted paths after prefix, each mapped to whether it is a leaf. A field
// whose type (or slice element type, then written Name[]) is a struct of
// package config is a node and is walked; any other field is a leaf, unit
// types such as config.Duration and structs of other packages included.
func configFields(typ reflect.Type, prefix string) map[string]bool {
	out := map[string]bool{}
	for _, f := range reflect.VisibleFields(typ) {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		name, ft := prefix+f.Name, f.Type
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			name, ft = name+"[]", ft.Elem()
		}
		if ft.Kind() != reflect.Struct || ft.PkgPath() != typ.PkgPath() {
			out[name] = true
			continue
		}
		out[name] = false
		for sub, leaf := range configFields(ft, name+".") {
			out[sub] = leaf
		}
	}
	return out
}

// codeSpan matches a backticked name in the table's first column.
var codeSpan = regexp.MustCompile("`([^`]+)`")

// optionTableNames returns the field paths of the first column of the table
// in core/config/README.md's "Configuration (the core schema)" section, expanded:
// `Delay.Quantile/Min/Max` is Delay.Quantile, Delay.Min and Delay.Max (after
// the first, a slash-separated name replaces the last path element), and a
// cell may hold several backticked names, as in `MaxPrefix`, `MaxLine`.
func optionTableNames(t *testing.T, readme string) []string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "# Configuration (the core schema)\n")
	if !ok {
		t.Fatal("core/config/README.md: no section \"# Configuration (the core schema)\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var names []string
	header := false
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 3 || strings.HasPrefix(line, "|---") {
			continue
		}
		cell := strings.TrimSpace(cells[1])
		if cell == "core field" {
			header = true
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
			first, siblings, _ := strings.Cut(m[1], "/")
			names = append(names, first)
			parent := first[:strings.LastIndex(first, ".")+1] // "" for a top-level field
			for _, s := range strings.Split(siblings, "/") {
				if s != "" {
					names = append(names, parent+s)
				}
			}
		}
	}
	if !header || len(names) == 0 {
		t.Fatal("core/config/README.md: no option table with a \"core field\" column in \"Configuration (the core schema)\"")
	}
	return names
}

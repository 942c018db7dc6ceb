//go:build gc
// +build gc

package traefikplugin

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// firstDifference names the first field, by its path, where got and want
// differ, and both values there: "Budget.Ratio = 0.2, want 0.1". (Values
// are compared and shown through fmt.) Compiled only: under Yaegi the
// values of interpreted structs are the interpreter's own
// (config_diff_yaegi_test.go).
func firstDifference(got, want any) string {
	if path, g, w, ok := differ(reflect.ValueOf(got), reflect.ValueOf(want), ""); ok {
		return fmt.Sprintf("%s = %s, want %s", strings.TrimPrefix(path, "."), g, w)
	}
	return "no field differs"
}

func differ(got, want reflect.Value, path string) (string, string, string, bool) {
	switch got.Kind() {
	case reflect.Struct:
		for i := 0; i < got.NumField(); i++ {
			if p, g, w, ok := differ(got.Field(i), want.Field(i), path+"."+got.Type().Field(i).Name); ok {
				return p, g, w, true
			}
		}
		return "", "", "", false
	case reflect.Slice:
		if got.Len() == want.Len() {
			for i := 0; i < got.Len(); i++ {
				if p, g, w, ok := differ(got.Index(i), want.Index(i), fmt.Sprintf("%s[%d]", path, i)); ok {
					return p, g, w, true
				}
			}
			return "", "", "", false
		}
	}
	if g, w := fmt.Sprintf("%#v", got), fmt.Sprintf("%#v", want); g != w {
		return path, fmt.Sprintf("%v", got), fmt.Sprintf("%v", want), true
	}
	return "", "", "", false
}

func TestFirstDifferenceNamesTheField(t *testing.T) {
	a := config.Config{Budget: config.BudgetConfig{Ratio: 0.2}, Methods: []string{"POST"}}
	b := config.Config{Budget: config.BudgetConfig{Ratio: 0.1}, Methods: []string{"POST"}}
	if got, want := firstDifference(a, b), "Budget.Ratio = 0.2, want 0.1"; got != want {
		t.Fatalf("firstDifference = %q, want %q", got, want)
	}
	if got := firstDifference(a, a); got != "no field differs" {
		t.Fatalf("firstDifference of equal configs = %q, want \"no field differs\"", got)
	}
}

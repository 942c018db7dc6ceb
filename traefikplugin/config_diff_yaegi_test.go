//go:build !gc
// +build !gc

package traefikplugin

// firstDifference under Yaegi, whose values of interpreted structs cannot
// be walked by reflection: the compiled test names the field.
func firstDifference(got, want any) string {
	return "a field differs (go test, compiled, names it)"
}

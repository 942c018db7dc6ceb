package traefikplugin

import (
	"reflect"
	"strings"
	"testing"

	"github.com/llmhedge/llmhedge/core/config"
)

// leafFields calls leaf for every field of t that holds a value (not a
// struct of further options), with its dotted path; a slice of structs
// (Upstreams) is walked as its element.
func leafFields(t reflect.Type, prefix string, leaf func(path string, f reflect.StructField)) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.PkgPath != "" { // unexported
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			leafFields(ft, prefix+f.Name+".", leaf)
			continue
		}
		leaf(prefix+f.Name, f)
	}
}

// mirrorTags maps each core path to the Traefik option that spells it.
func mirrorTags(t *testing.T) map[string]string {
	spelled := map[string]string{}
	leafFields(reflect.TypeOf(Config{}), "", func(path string, f reflect.StructField) {
		target := f.Tag.Get("core")
		if target == "" {
			t.Errorf("traefikplugin.Config.%s has no core tag (the core field it fills, or \"-\")", path)
		}
		if target != "" && target != "-" {
			spelled[target] = path
		}
	})
	return spelled
}

// Every field of config.Config has a Traefik spelling: a new core option
// fails here until traefikplugin.Config mirrors it.
func TestEveryCoreFieldHasATraefikSpelling(t *testing.T) {
	spelled := mirrorTags(t)
	coreFields := map[string]bool{}
	leafFields(reflect.TypeOf(config.Config{}), "", func(path string, _ reflect.StructField) {
		coreFields[path] = true
		if _, ok := spelled[path]; !ok {
			t.Errorf("config.Config.%s has no Traefik spelling: add a field to traefikplugin.Config with core:%q", path, path)
		}
	})
	for target, option := range spelled {
		if !coreFields[target] {
			t.Errorf("traefikplugin.Config.%s: core tag %q names no config.Config field", option, target)
		}
	}
}

// Every mirrored option reaches the core field its tag names: set each to
// a non-zero value and look for it in the converted configuration.
func TestEveryTraefikOptionReachesItsCoreField(t *testing.T) {
	var cfg Config
	cfg.Upstreams = []Upstream{{}}
	fillLeaves(reflect.ValueOf(&cfg).Elem())
	got, _ := cfg.toCore("route") // values need not be valid here
	coreValue := reflect.ValueOf(got)
	for target, option := range mirrorTags(t) {
		v := coreValue
		for _, name := range strings.Split(target, ".") {
			if v.Kind() == reflect.Slice {
				if v.Len() == 0 {
					break
				}
				v = v.Index(0)
			}
			v = v.FieldByName(name)
		}
		if !v.IsValid() || v.IsZero() {
			t.Errorf("traefikplugin.Config.%s set, but config.Config.%s is still zero", option, target)
		}
	}
}

// fillLeaves sets every field of v to a non-zero value of its kind; a
// string is a duration, which every string option but the enumerations
// accepts as a value (they only need to arrive, not to be valid).
func fillLeaves(v reflect.Value) {
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if !f.CanSet() {
			continue
		}
		switch f.Kind() {
		case reflect.Struct:
			fillLeaves(f)
		case reflect.Slice:
			if f.Type().Elem().Kind() == reflect.Struct {
				for j := 0; j < f.Len(); j++ {
					fillLeaves(f.Index(j))
				}
			} else {
				f.Set(reflect.ValueOf([]string{"X-Option"}))
			}
		case reflect.Map:
			f.Set(reflect.ValueOf(map[string]string{"X-Option": "set"}))
		case reflect.String:
			f.SetString("7s")
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int64:
			f.SetInt(3)
		case reflect.Float64:
			f.SetFloat(0.5)
		}
	}
}

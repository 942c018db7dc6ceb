package stream

import (
	"bytes"
	"encoding/json"

	"github.com/llmhedge/llmhedge/core/config"
)

// Validity checks of an answer: the configured names (package config) as
// bits, and the schema the request asks for.

// Check bits, in the order FailedCheck tries them.
const (
	CheckFinish     int = 1
	CheckNoRefusal  int = 2
	CheckJSON       int = 4
	CheckJSONSchema int = 8
)

// CheckBits reads check names (config.ParseChecks) into check bits.
func CheckBits(items []string) (int, error) {
	names, err := config.ParseChecks(items)
	if err != nil {
		return 0, err
	}
	checks := 0
	for _, name := range names {
		switch name {
		case config.ValidateJSON:
			checks |= CheckJSON
		case config.ValidateJSONSchema:
			checks |= CheckJSONSchema
		case config.ValidateFinish:
			checks |= CheckFinish
		case config.ValidateNoRefusal:
			checks |= CheckNoRefusal
		}
	}
	return checks, nil
}

// FirstCheckName names the first check of a set, in FailedCheck's order.
func FirstCheckName(checks int) string {
	switch {
	case checks&CheckFinish != 0:
		return config.ValidateFinish
	case checks&CheckNoRefusal != 0:
		return config.ValidateNoRefusal
	case checks&CheckJSON != 0:
		return config.ValidateJSON
	}
	return config.ValidateJSONSchema
}

// RequestSchema is the JSON schema the request asks the answer to follow:
// Chat's response_format {type: json_schema, json_schema: {schema}}, the
// Responses API's text.format {type: json_schema, schema}, or Anthropic's
// output_format {type: json_schema, schema}; nil when it sends none.
func RequestSchema(body []byte) interface{} {
	if !bytes.Contains(body, []byte("json_schema")) {
		return nil // the common case, without decoding the body
	}
	var req struct {
		ResponseFormat *struct {
			Type       string `json:"type"`
			JSONSchema *struct {
				Schema interface{} `json:"schema"`
			} `json:"json_schema"`
		} `json:"response_format"`
		Text *struct {
			Format *schemaFormat `json:"format"`
		} `json:"text"`
		OutputFormat *schemaFormat `json:"output_format"`
	}
	if json.Unmarshal(body, &req) != nil {
		return nil
	}
	if rf := req.ResponseFormat; rf != nil && rf.Type == "json_schema" && rf.JSONSchema != nil {
		return rf.JSONSchema.Schema
	}
	if req.Text != nil && req.Text.Format != nil && req.Text.Format.Type == "json_schema" {
		return req.Text.Format.Schema
	}
	if of := req.OutputFormat; of != nil && of.Type == "json_schema" {
		return of.Schema
	}
	return nil
}

// schemaFormat is a {type, schema} format object.
type schemaFormat struct {
	Type   string      `json:"type"`
	Schema interface{} `json:"schema"`
}

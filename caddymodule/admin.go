package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmhedge/llmhedge/core"
)

func init() {
	caddy.RegisterModule(AdminSwitch{})
}

// AdminSwitch is the admin API module admin.api.llm_hedge: the
// per-process kill switch of this Caddy's llm_hedge handlers on Caddy's
// admin endpoint. GET /llm_hedge/switch lists the switches, POST
// /llm_hedge/switch with {"route": "chat", "paused": true, "delay":
// "250ms"|"auto"} changes one (no route: every route). The switches are
// the process's, not the configuration's: they survive a reload (POST
// /load, caddy reload) and end with the process.
type AdminSwitch struct{}

// CaddyModule returns the Caddy module information.
func (AdminSwitch) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.llm_hedge",
		New: func() caddy.Module { return new(AdminSwitch) },
	}
}

// processSwitches are this Caddy process's kill switches: one table for
// the admin endpoint and every handler, kept across configuration reloads
// (which provision new handlers and a new admin server).
var processSwitches = core.NewSwitches()

// Routes returns the admin routes of the switch.
func (AdminSwitch) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{
		Pattern: "/llm_hedge/switch",
		Handler: caddy.AdminHandlerFunc(serveAdminSwitch),
	}}
}

// serveAdminSwitch answers itself, errors included ({"error": ...}, as
// Caddy's admin API answers its own). Caddy checks the Host; the switch
// refuses a foreign Origin and a POST not declared JSON.
func serveAdminSwitch(w http.ResponseWriter, r *http.Request) error {
	core.ServeSwitchAdmin(processSwitches, w, r)
	return nil
}

// Interface guards.
var (
	_ caddy.Module      = (*AdminSwitch)(nil)
	_ caddy.AdminRouter = (*AdminSwitch)(nil)
)

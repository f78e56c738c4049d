//go:build !machinery_v1_14

// Machinery v1.12 and v1.13: the calls whose signatures changed in v1.14 (scripts/build-talos-oracle.sh
// sets the build tag by the version it builds against).
package main

import (
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
)

func validateConfig(cfg config.Provider, mode validation.RuntimeMode, opts ...validation.Option) ([]string, error) {
	return cfg.Validate(mode, opts...)
}

func validateSecretsBundle(bundle *secrets.Bundle, _ *config.VersionContract) error {
	return bundle.Validate()
}

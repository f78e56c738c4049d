//go:build machinery_v1_14

// Machinery v1.14 and later: client-side validation has its own method (Validate is deprecated), and a
// secrets bundle is validated against the version contract it will be used with.
package main

import (
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
)

func validateConfig(cfg config.Provider, mode validation.RuntimeMode, opts ...validation.Option) ([]string, error) {
	return cfg.ValidateAsClient(mode, opts...)
}

func validateSecretsBundle(bundle *secrets.Bundle, versionContract *config.VersionContract) error {
	return bundle.Validate(versionContract)
}

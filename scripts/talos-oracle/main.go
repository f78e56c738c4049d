// talos-oracle: what `talosctl validate` and `talosctl gen config` / `gen secrets` do, in a binary built
// from Talos's machinery module alone (talosctl's own module pulls dependencies the Go module proxy does
// not serve here). The tests render configs with our Python code and hold them against this program,
// built once per Talos line (scripts/build-talos-oracle.sh).
//
//	talos-oracle validate --mode metal [--strict] [--json] FILE...
//	talos-oracle gen-config --with-secrets secrets.yaml --talos-version v1.13.7 --kubernetes-version 1.36.3 \
//	    --install-disk /dev/sda --install-image IMAGE [--config-patch @FILE]... \
//	    [--config-patch-control-plane @FILE]... [--config-patch-worker @FILE]... --output DIR NAME ENDPOINT
//	talos-oracle gen-secrets [--talos-version v1.13.7] --output-file secrets.yaml
//	talos-oracle version
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/bundle"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"github.com/siderolabs/talos/pkg/machinery/constants"
)

const machineryModule = "github.com/siderolabs/talos/pkg/machinery"

func main() {
	if len(os.Args) < 2 {
		usage()
	}

	var err error

	switch os.Args[1] {
	case "validate":
		err = validateCommand(os.Args[2:])
	case "gen-config":
		err = genConfigCommand(os.Args[2:])
	case "gen-secrets":
		err = genSecretsCommand(os.Args[2:])
	case "version":
		err = versionCommand()
	default:
		usage()
	}

	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %s\n", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: talos-oracle validate|gen-config|gen-secrets|version [flags] (-h for a subcommand's flags)")
	os.Exit(2)
}

// repeated is a flag that may be given many times, in order (talosctl's StringArray flags).
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// ---------------------------------------------------------------- validate

// runtimeMode is the runtime mode a config is validated for. talosctl takes its mode type from Talos's
// internal machined package; machinery only asks for this interface, and "metal" is the one mode that
// requires an install (the check that install disk and image are set) and is not a container.
type runtimeMode string

func (m runtimeMode) String() string        { return string(m) }
func (m runtimeMode) RequiresInstall() bool { return m == "metal" }
func (m runtimeMode) InContainer() bool     { return m == "container" }

// validationResult is one file's outcome, printed as one JSON line with --json.
type validationResult struct {
	File     string   `json:"file"`
	Valid    bool     `json:"valid"`
	Warnings []string `json:"warnings"`
	Error    string   `json:"error,omitempty"`
}

func validateCommand(args []string) error {
	fs := flag.NewFlagSet("validate", flag.ExitOnError)
	mode := fs.String("mode", "", "runtime mode: metal, cloud or container (as talosctl validate --mode)")
	strict := fs.Bool("strict", false, "treat validation warnings as errors")
	asJSON := fs.Bool("json", false, "print one JSON line per file instead of text")
	var configs repeated
	fs.Var(&configs, "config", "a config file (repeatable; files may also follow the flags)")
	fs.Parse(args) //nolint:errcheck // ExitOnError

	switch *mode {
	case "metal", "cloud", "container":
	default:
		return fmt.Errorf("--mode %q: expected metal, cloud or container", *mode)
	}

	files := append(configs, fs.Args()...)
	if len(files) == 0 {
		return errors.New("no config file given")
	}

	// Validation options as talosctl validate passes them: local (outside a node), strict on request.
	opts := []validation.Option{validation.WithLocal()}
	if *strict {
		opts = append(opts, validation.WithStrict())
	}

	failed := 0

	// One process validates many files: the tests check hundreds of rendered configs.
	for _, file := range files {
		result := validationResult{File: file, Warnings: []string{}}

		cfg, err := configloader.NewFromFile(file)
		if err == nil {
			result.Warnings, err = validateConfig(cfg, runtimeMode(*mode), opts...)
			if result.Warnings == nil {
				result.Warnings = []string{}
			}
		}

		result.Valid = err == nil
		if err != nil {
			result.Error = err.Error()
			failed++
		}

		if *asJSON {
			line, _ := json.Marshal(result) //nolint:errchkjson
			fmt.Println(string(line))

			continue
		}

		for _, w := range result.Warnings {
			fmt.Fprintf(os.Stderr, "%s: warning: %s\n", file, w)
		}

		if result.Valid {
			fmt.Printf("%s is valid for %s mode\n", file, *mode)
		} else {
			fmt.Printf("%s: %s\n", file, result.Error)
		}
	}

	if failed > 0 {
		return fmt.Errorf("%d of %d configs are not valid for %s mode", failed, len(files), *mode)
	}

	return nil
}

// ---------------------------------------------------------------- gen-config

func genConfigCommand(args []string) error {
	fs := flag.NewFlagSet("gen-config", flag.ExitOnError)
	withSecrets := fs.String("with-secrets", "", "a secrets bundle (talosctl gen secrets format)")
	talosVersion := fs.String("talos-version", "", "the version contract to generate for, e.g. v1.13.7")
	kubernetesVersion := fs.String("kubernetes-version", constants.DefaultKubernetesVersion, "Kubernetes version")
	installDisk := fs.String("install-disk", "/dev/sda", "the disk to install to")
	installImage := fs.String("install-image", "", "the installer image (required: talosctl's default names its own build)")
	dnsDomain := fs.String("dns-domain", "cluster.local", "the cluster's DNS domain")
	withClusterDiscovery := fs.Bool("with-cluster-discovery", true, "enable cluster discovery")
	withDocs := fs.Bool("with-docs", true, "write each field's documentation as comments")
	withExamples := fs.Bool("with-examples", true, "write commented examples")
	output := fs.String("output", ".", "directory to write controlplane.yaml and worker.yaml into")
	var patches, patchesControlPlane, patchesWorker repeated
	fs.Var(&patches, "config-patch", "patch for every machine type; @FILE reads a file (repeatable, applied in order)")
	fs.Var(&patchesControlPlane, "config-patch-control-plane", "patch for control planes (repeatable)")
	fs.Var(&patchesWorker, "config-patch-worker", "patch for workers (repeatable)")
	fs.Parse(args) //nolint:errcheck // ExitOnError

	if fs.NArg() != 2 {
		return errors.New("expected two arguments: <cluster name> <cluster endpoint>")
	}

	clusterName, endpoint := fs.Arg(0), fs.Arg(1)

	if err := checkEndpoint(endpoint); err != nil {
		return err
	}

	if *installImage == "" {
		return errors.New("--install-image is required")
	}

	var (
		genOptions      []generate.Option
		versionContract *config.VersionContract
		err             error
	)

	if *talosVersion != "" {
		if versionContract, err = config.ParseContractFromVersion(*talosVersion); err != nil {
			return fmt.Errorf("invalid talos-version: %w", err)
		}

		genOptions = append(genOptions, generate.WithVersionContract(versionContract))
	}

	if *withSecrets != "" {
		secretsBundle, err := secrets.LoadBundle(*withSecrets)
		if err != nil {
			return fmt.Errorf("failed to load secrets bundle: %w", err)
		}

		if err = validateSecretsBundle(secretsBundle, versionContract); err != nil {
			return fmt.Errorf("failed to validate secrets bundle: %w", err)
		}

		genOptions = append(genOptions, generate.WithSecretsBundle(secretsBundle))
	}

	// The options talosctl gen config passes with its default flags (no SANs, no registry mirrors,
	// no --with-kubespan: our render sets KubeSpan by patch).
	genOptions = append(genOptions,
		generate.WithInstallDisk(*installDisk),
		generate.WithInstallImage(*installImage),
		generate.WithAdditionalSubjectAltNames([]string{}),
		generate.WithDNSDomain(*dnsDomain),
		generate.WithClusterDiscovery(*withClusterDiscovery),
	)

	bundleOptions := []bundle.Option{
		bundle.WithInputOptions(&bundle.InputOptions{
			ClusterName: clusterName,
			Endpoint:    endpoint,
			KubeVersion: strings.TrimPrefix(*kubernetesVersion, "v"),
			GenOptions:  genOptions,
		}),
	}

	for _, group := range []struct {
		flag    string
		values  []string
		asPatch func([]configpatcher.Patch) bundle.Option
	}{
		{"--config-patch", patches, bundle.WithPatch},
		{"--config-patch-control-plane", patchesControlPlane, bundle.WithPatchControlPlane},
		{"--config-patch-worker", patchesWorker, bundle.WithPatchWorker},
	} {
		loaded, err := configpatcher.LoadPatches(group.values)
		if err != nil {
			return fmt.Errorf("%s: error parsing config patch: %w", group.flag, err)
		}

		bundleOptions = append(bundleOptions, group.asPatch(loaded))
	}

	configBundle, err := bundle.NewBundle(bundleOptions...)
	if err != nil {
		return fmt.Errorf("failed to generate config bundle: %w", err)
	}

	comments := encoder.CommentsDisabled
	if *withDocs {
		comments |= encoder.CommentsDocs
	}

	if *withExamples {
		comments |= encoder.CommentsExamples
	}

	if err = os.MkdirAll(*output, 0o700); err != nil {
		return err
	}

	for _, machineType := range []machine.Type{machine.TypeControlPlane, machine.TypeWorker} {
		data, err := configBundle.Serialize(comments, machineType)
		if err != nil {
			return fmt.Errorf("%s: %w", machineType, err)
		}

		// Machine configs carry the cluster's keys: owner-only, as our render writes them.
		if err = os.WriteFile(filepath.Join(*output, machineType.String()+".yaml"), data, 0o600); err != nil {
			return err
		}
	}

	return nil
}

// checkEndpoint refuses what talosctl gen config refuses before generating: an endpoint that is not an
// https:// URL with a host.
func checkEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil {
		return fmt.Errorf("failed to parse the cluster endpoint URL: %w", err)
	}

	if u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("the control plane endpoint URL should have scheme https:// and a host, got %q", endpoint)
	}

	return nil
}

// ---------------------------------------------------------------- gen-secrets

func genSecretsCommand(args []string) error {
	fs := flag.NewFlagSet("gen-secrets", flag.ExitOnError)
	talosVersion := fs.String("talos-version", "", "the version contract to generate for, e.g. v1.13.7")
	outputFile := fs.String("output-file", "secrets.yaml", "where to write the bundle")
	fs.Parse(args) //nolint:errcheck // ExitOnError

	var (
		versionContract *config.VersionContract
		err             error
	)

	if *talosVersion != "" {
		if versionContract, err = config.ParseContractFromVersion(*talosVersion); err != nil {
			return fmt.Errorf("invalid talos-version: %w", err)
		}
	}

	secretsBundle, err := secrets.NewBundle(secrets.NewFixedClock(time.Now()), versionContract)
	if err != nil {
		return fmt.Errorf("failed to create secrets bundle: %w", err)
	}

	data, err := yaml.Marshal(secretsBundle)
	if err != nil {
		return err
	}

	if _, err = os.Stat(*outputFile); err == nil {
		return fmt.Errorf("%s already exists (a secrets bundle is never overwritten)", *outputFile)
	}

	return os.WriteFile(*outputFile, data, 0o600)
}

// ---------------------------------------------------------------- version

// versionCommand prints, as JSON, which machinery the binary was built against, the Kubernetes version
// its gen config picks by default, and any dependency built at another version than machinery asks for
// (scripts/build-talos-oracle.sh substitutes those the module proxy does not serve).
func versionCommand() error {
	machinery, replaced := "unknown", map[string]string{}

	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == machineryModule {
				machinery = dep.Version
			}

			if dep.Replace != nil {
				replaced[dep.Path+"@"+dep.Version] = dep.Replace.Path + "@" + dep.Replace.Version
			}
		}
	}

	line, err := json.Marshal(map[string]any{
		"machinery":                machinery,
		"defaultKubernetesVersion": constants.DefaultKubernetesVersion,
		"replaced":                 replaced,
	})
	if err != nil {
		return err
	}

	fmt.Println(string(line))

	return nil
}

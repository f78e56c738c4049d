#!/usr/bin/env bash
# Build the real tools the engine tier runs, from Go modules only, into .tools/bin.
#
# Each binary is built once per version into a cache outside the checkout ($TOOLS_CACHE, default
# ~/.cache/talos-proxmox-pulumi/tools) and linked into .tools/bin, so a fresh clone on the same machine
# (CI) reuses it. Nothing is downloaded but Go modules through the module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source scripts/tool-versions.env

cache=${TOOLS_CACHE:-$HOME/.cache/talos-proxmox-pulumi/tools}
bin=$root/.tools/bin
mkdir -p "$cache" "$bin"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# A module's go.mod replace lines that point at another module (relative-path replaces only make
# sense inside the upstream repository, so those become plain requires instead).
module_replaces() {
  local gomod=$1
  awk '
    /^replace \(/ {block=1; next}
    block && /^\)/ {block=0; next}
    block && /=>/ {print "replace " $0; next}
    block {next}
    /^replace / {print}
  ' "$gomod" | grep -v -E '=> *\.\.?/' || true
}

# go_tool NAME MODULE VERSION PACKAGE [LDFLAGS [NESTED_MODULE...]]
# Builds PACKAGE (inside MODULE@VERSION) in a throw-away module that copies MODULE's replace lines;
# nested modules that MODULE replaces by a relative path are required at VERSION instead.
# Every step checks its own result: this runs under `attempt`, where `set -e` does not apply.
go_tool() {
  local name=$1 module=$2 version=$3 package=$4 ldflags=${5:-}
  local nested=("${@:6}") gets=("$2@$3") each
  for each in "${nested[@]}"; do gets+=("$each@$version"); done
  local out=$cache/$name-$version work=$cache/$name-$version.src gomod
  if [ -x "$out/$name" ]; then
    log "$name $version: cached"
    ln -sf "$out/$name" "$bin/$name"
    return 0
  fi
  log "$name $version: building $package (first build takes minutes; later ones reuse the Go cache)"
  rm -rf "$work" && mkdir -p "$work" "$out" || return 1
  gomod=$(cd "$work" && go mod download -json "$module@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  if [ -z "$gomod" ]; then
    (cd "$work" && go mod download -json "$module@$version" | grep '"Error"' >&2)
    return 1
  fi
  (
    cd "$work" &&
      go mod init "local/build-$name" >/dev/null 2>&1 &&
      module_replaces "$gomod" >> go.mod &&
      go get "${gets[@]}" &&
      go build -trimpath -ldflags "-s -w $ldflags" -o "$out/$name" "$package"
  ) || return 1
  rm -rf "$work"
  ln -sf "$out/$name" "$bin/$name"
  log "$name $version: built"
}

# `scripts/tools.sh` builds every tool that can be built here (what the tests use); `scripts/tools.sh
# NAME...` builds only those, and also tries the ones the module proxy does not serve today (blocked:
# listed with the reason in scripts/tool-versions.env), printing the proxy's own words.
# Exits non-zero naming what it could not build.
wanted=("$@")
missing=()
attempt() {
  local name=$1; shift
  if [ ${#wanted[@]} -gt 0 ] && [[ " ${wanted[*]} " != *" $name "* ]]; then
    return 0
  fi
  if ! "$@"; then
    log "$name: NOT BUILT (see the error above)"
    missing+=("$name")
  fi
}
blocked() {
  local name=$1 why=$2; shift 2
  if [ ${#wanted[@]} -gt 0 ] && [[ " ${wanted[*]} " == *" $name "* ]]; then
    attempt "$name" "$@"
  else
    log "$name: not built ($why; see scripts/tool-versions.env)"
  fi
}

attempt pulumi go_tool pulumi github.com/pulumi/pulumi/pkg/v3 "$PULUMI_VERSION" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi \
  "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION"

# The language host, from the last sdk/v3 release that holds it, and, beside it, the executor script it
# refuses to start without, from the same release.
attempt pulumi-language-python go_tool pulumi-language-python github.com/pulumi/pulumi/sdk/v3 \
  "$PULUMI_LANGUAGE_PYTHON_VERSION" github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python \
  "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_LANGUAGE_PYTHON_VERSION"
python_host_files() {
  local sdk_dir
  sdk_dir=$(go mod download -json "github.com/pulumi/pulumi/sdk/v3@$PULUMI_LANGUAGE_PYTHON_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -n "$sdk_dir" ] || return 1
  # Beside the host's real path: it looks for the executor in its own directory.
  install -m 0755 "$sdk_dir/python/cmd/pulumi-language-python-exec" \
    "$cache/pulumi-language-python-$PULUMI_LANGUAGE_PYTHON_VERSION/pulumi-language-python-exec" &&
    ln -sf "$cache/pulumi-language-python-$PULUMI_LANGUAGE_PYTHON_VERSION/pulumi-language-python-exec" \
      "$bin/pulumi-language-python-exec" &&
    # Our own launcher for dynamic providers: the dynamic-provider host with the project's venv.
    install -m 0755 scripts/pulumi-resource-pulumi-python "$bin/pulumi-resource-pulumi-python" &&
    log "pulumi-language-python-exec $PULUMI_LANGUAGE_PYTHON_VERSION and pulumi-resource-pulumi-python: installed"
}
attempt pulumi-language-python-exec python_host_files

# Provider plugins at the exact version the pinned Python SDK asks the engine for.
proxmoxve_version=v$(sed -n 's/^pulumi-proxmoxve==//p' requirements.txt)
blocked pulumi-resource-proxmoxve "no version served by the module proxy" \
  go_tool pulumi-resource-proxmoxve github.com/muhlba91/pulumi-proxmoxve/provider \
  "$PROXMOXVE_PROVIDER_COMMIT" github.com/muhlba91/pulumi-proxmoxve/provider/cmd/pulumi-resource-proxmoxve \
  "-X github.com/muhlba91/pulumi-proxmoxve/provider/pkg/version.Version=$proxmoxve_version"

# Our talos-oracle, once per Talos line (TALOS_ORACLE_MACHINERY_VERSIONS): the real Talos code checks every render.
attempt talos-oracle bash scripts/build-talos-oracle.sh

# talosctl at the Talos release whose configs we render (TALOSCTL_VERSION), the oracle for them.
blocked talosctl "dependencies refused by the module proxy" \
  go_tool talosctl github.com/siderolabs/talos "$TALOSCTL_VERSION" github.com/siderolabs/talos/cmd/talosctl \
  "-X github.com/siderolabs/talos/pkg/machinery/version.Tag=$TALOSCTL_VERSION" github.com/siderolabs/talos/pkg/machinery

if [ ${#missing[@]} -gt 0 ]; then
  log "not built: ${missing[*]}"
  exit 1
fi
log "tools in $bin"

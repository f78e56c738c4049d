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
# nested modules that MODULE replaces by a relative path are required at VERSION instead. With
# go_tool_replaces=FUNCTION set, FUNCTION GOMOD prints more replace lines for the throw-away module.
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
      "${go_tool_replaces:-true}" "$gomod" >> go.mod &&
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

# The Kubernetes control plane the engine tier runs (tests/stand_ins/kubernetes_cluster.py): etcd, whose main
# package is the root of go.etcd.io/etcd/server/v3 (its relative replaces dropped: its own requires name
# its sibling modules at the same release), and kwok, playing the nodes' kubelets.
attempt etcd go_tool etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
attempt kwok go_tool kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
# The backups' S3-compatible server (tests/stand_ins/s3_server.py): versitygw's posix gateway, with
# SigV4 authentication, so wrong credentials are refused as a real bucket refuses them.
attempt versitygw go_tool versitygw github.com/versity/versitygw "$VERSITYGW_VERSION" \
  github.com/versity/versitygw/cmd/versitygw

# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and
# replaces them by ./staging/src paths: outside its repository each is replaced by its published
# release instead, v0.MINOR.PATCH for Kubernetes v1.MINOR.PATCH.
kubernetes_staging_replaces() {
  awk -v v="v0.${KUBERNETES_VERSION#v1.}" '$2 == "=>" && $3 ~ /^\.\/staging\// {print "replace " $1 " => " $1 " " v}' "$1"
}
# kube-apiserver, kube-controller-manager, kube-scheduler; the version ldflags make /version and
# --version say the release (v0.0.0-master without them).
kubernetes_tool() {
  local name=$1 minor=${KUBERNETES_VERSION#v1.} version=k8s.io/component-base/version
  minor=${minor%%.*}
  go_tool_replaces=kubernetes_staging_replaces go_tool "$name" k8s.io/kubernetes "$KUBERNETES_VERSION" \
    "k8s.io/kubernetes/cmd/$name" \
    "-X $version.gitVersion=$KUBERNETES_VERSION -X $version.gitMajor=1 -X $version.gitMinor=$minor"
}
for each in kube-apiserver kube-controller-manager kube-scheduler; do
  attempt "$each" kubernetes_tool "$each"
done

# source_tool NAME VERSION TARBALL MODULE_DIR PACKAGE LDFLAGS PREPARE
# Builds PACKAGE from an upstream tarball in ../shared/third_party (modules the proxy refuses), after
# PREPARE (a function run in MODULE_DIR) has pointed its go.mod at modules the proxy serves.
source_tool() {
  local name=$1 version=$2 tarball=$third_party/$3 module_dir=$4 package=$5 ldflags=$6 prepare=$7
  local out=$cache/$name-$version work=$cache/$name-$version.src
  if [ -x "$out/$name" ]; then
    log "$name $version: cached"
    ln -sf "$out/$name" "$bin/$name"
    return 0
  fi
  if [ ! -f "$tarball" ]; then
    log "$name $version: no source at $tarball (CI has ../shared/third_party beside the checkout)"
    return 1
  fi
  log "$name $version: building from $(basename "$tarball") (minutes on a cold Go cache)"
  rm -rf "$work" && mkdir -p "$work" "$out" && tar -xzf "$tarball" -C "$work" || return 1
  (
    cd "$work/$module_dir" &&
      "$prepare" &&
      go build -trimpath -ldflags "-s -w $ldflags" -o "$out/$name" "$package"
  ) || { rm -f "$out/$name"; return 1; }
  rm -rf "$work"
  ln -sf "$out/$name" "$bin/$name"
  log "$name $version: built"
}
third_party=${THIRD_PARTY_DIR:-$root/../shared/third_party}

# The language host's go.mod replaces sdk/v3 and pkg/v3 by paths inside pulumi's repository: require
# both at the host's own release instead (served).
prepare_language_python() {
  go mod edit -dropreplace=github.com/pulumi/pulumi/pkg/v3 -dropreplace=github.com/pulumi/pulumi/sdk/v3 &&
    go get "github.com/pulumi/pulumi/pkg/v3@$PULUMI_VERSION" "github.com/pulumi/pulumi/sdk/v3@$PULUMI_VERSION"
}
python_host_files() {
  local dir=$cache/pulumi-language-python-$PULUMI_VERSION
  if [ ! -x "$dir/pulumi-language-python-exec" ]; then
    tar -xzf "$third_party/pulumi-language-python-$PULUMI_VERSION.tar.gz" -C "$dir" --strip-components=4 \
      ./sdk/python/cmd/pulumi-language-python-exec &&
      tar -xzf "$third_party/pulumi-language-python-$PULUMI_VERSION.tar.gz" -C "$dir" --strip-components=4 \
        ./sdk/python/dist/pulumi-resource-pulumi-python || return 1
  fi
  # The host refuses to start without its executor in its own directory; the engine finds the
  # dynamic-provider launcher on PATH.
  ln -sf "$dir/pulumi-language-python-exec" "$bin/pulumi-language-python-exec" &&
    ln -sf "$dir/pulumi-resource-pulumi-python" "$bin/pulumi-resource-pulumi-python"
}
build_language_python() {
  source_tool pulumi-language-python "$PULUMI_VERSION" "pulumi-language-python-$PULUMI_VERSION.tar.gz" \
    sdk/python/cmd/pulumi-language-python . \
    "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION" prepare_language_python &&
    python_host_files
}
attempt pulumi-language-python build_language_python

# A file:// module proxy, first in GOPROXY, for modules whose .info and .mod the proxy refuses while it
# serves their .zip: the .mod is the go.mod inside that zip, and go.sum still verifies both.
zip_only_proxy() {
  local dir=$cache/zip-only-proxy module version zip
  for each in "$@"; do
    module=${each%@*} version=${each#*@}
    zip=$dir/$module/@v/$version.zip
    if [ ! -f "$dir/$module/@v/$version.mod" ]; then
      mkdir -p "$dir/$module/@v" &&
        curl -fsSL -o "$zip" "https://proxy.golang.org/$module/@v/$version.zip" &&
        unzip -p "$zip" "$module@$version/go.mod" > "$dir/$module/@v/$version.mod" &&
        echo "$version" >> "$dir/$module/@v/list" || return 1
    fi
  done
  echo "file://$dir"
}
prepare_proxmoxve() {
  local local_proxy
  local_proxy=$(zip_only_proxy $PROXMOXVE_ZIP_ONLY_MODULES) || return 1
  export GOPROXY="$local_proxy,${GOPROXY:-https://proxy.golang.org}" GONOSUMDB=github.com/pulumi
}
# Provider plugins at the exact version the pinned Python SDK asks the engine for.
proxmoxve_version=$(sed -n 's/^pulumi-proxmoxve==//p' requirements.txt)
attempt pulumi-resource-proxmoxve source_tool pulumi-resource-proxmoxve "$proxmoxve_version" \
  "pulumi-proxmoxve-v$proxmoxve_version-provider.tar.gz" provider ./cmd/pulumi-resource-proxmoxve \
  "-X github.com/muhlba91/pulumi-proxmoxve/provider/pkg/version.Version=$proxmoxve_version" prepare_proxmoxve

# The Kubernetes plugin replaces its sdk/v4 by a path in its repository (required at its release
# instead), and pins two versions the proxy refuses (swapped for the nearest it serves); then its
# generate step writes the embedded, versioned schema.
kubernetes_version=$(sed -n 's/^pulumi-kubernetes==//p' requirements.txt)
prepare_kubernetes() {
  local each
  # Edited into go.mod, not `go get`: go get would first read the refused versions' .mod files.
  for each in $KUBERNETES_PLUGIN_SUBSTITUTES; do go mod edit -require="$each" || return 1; done
  go mod edit -dropreplace=github.com/pulumi/pulumi-kubernetes/sdk/v4 &&
    go get "github.com/pulumi/pulumi-kubernetes/sdk/v4@v$kubernetes_version" &&
    (cd cmd/pulumi-resource-kubernetes && VERSION=$kubernetes_version go run ./generate.go)
}
attempt pulumi-resource-kubernetes source_tool pulumi-resource-kubernetes "$kubernetes_version" \
  "pulumi-kubernetes-v$kubernetes_version-provider.tar.gz" provider ./cmd/pulumi-resource-kubernetes \
  "-X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$kubernetes_version" prepare_kubernetes

# Cilium's LB-IPAM CRDs (what its operator registers at run time; no Cilium runs under kwok), at the
# chart's release, from the github.com/cilium/cilium module zip the proxy serves.
cilium_crds() {
  local out=$cache/cilium-crds-$CILIUM_VERSION dir file
  if [ ! -f "$out/.complete" ]; then
    log "cilium CRDs $CILIUM_VERSION: downloading github.com/cilium/cilium (35 MB)"
    dir=$(cd "$cache" && go mod download -json "github.com/cilium/cilium@$CILIUM_VERSION" |
      sed -n 's/.*"Dir": "\(.*\)".*/\1/p') || return 1
    [ -n "$dir" ] || return 1
    mkdir -p "$out" || return 1
    for file in $CILIUM_CRD_FILES; do
      cp "$dir/pkg/k8s/apis/cilium.io/client/crds/$file" "$out/" || return 1
    done
    touch "$out/.complete"
  fi
  ln -sfn "$out" "$root/.tools/cilium-crds"
  log "cilium CRDs $CILIUM_VERSION: in .tools/cilium-crds"
}
attempt cilium-crds cilium_crds

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

#!/usr/bin/env bash
# Build talos-oracle (scripts/talos-oracle/, our own Go source) against Talos's machinery module, once per
# Talos line, and link each binary as .tools/bin/talos-oracle-v<major>.<minor>.
#
#   bash scripts/build-talos-oracle.sh              # every version below
#   bash scripts/build-talos-oracle.sh v1.13.9      # one machinery version
#
# Each build is a throw-away module under $TOOLS_CACHE/talos-oracle-<version> (default
# ~/.cache/talos-proxmox-pulumi/tools), reused while its binary exists and the source is unchanged.
# Only Go modules are downloaded, through the module proxy.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
# TALOS_ORACLE_MACHINERY_VERSIONS and TALOS_ORACLE_SUBSTITUTES
source scripts/tool-versions.env
src=$root/scripts/talos-oracle
cache=${TOOLS_CACHE:-$HOME/.cache/talos-proxmox-pulumi/tools}
bin=$root/.tools/bin
mkdir -p "$cache" "$bin"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

log() { printf '[talos-oracle %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# The source's fingerprint: a binary built from other source is rebuilt.
source_hash=$(cat "$src"/*.go | sha256sum | cut -c1-16)

build() {
  local version=$1
  if ! [[ $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]]; then
    log "$version: expected a release version like v1.13.9"
    return 1
  fi
  local major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
  local line=v$major.$minor work=$cache/talos-oracle-$version tags=""
  local binary=$work/talos-oracle
  # machinery v1.14 changed two signatures (see scripts/talos-oracle/machinery_v1_14.go).
  if (( major > 1 || minor >= 14 )); then tags=machinery_v1_14; fi

  if [ -x "$binary" ] && [ "$(cat "$work/source-hash" 2>/dev/null)" = "$source_hash" ]; then
    log "$line ($version): cached"
  else
    log "$line ($version): building (first build takes minutes on 2 cores)"
    mkdir -p "$work"
    rm -f "$work"/*.go "$work/talos-oracle" "$work/source-hash"
    cp "$src"/*.go "$work/"
    local substitute gets=("github.com/siderolabs/talos/pkg/machinery@$version")
    (
      cd "$work" &&
        rm -f go.mod go.sum &&
        go mod init local/talos-oracle >/dev/null 2>&1 &&
        for substitute in ${TALOS_ORACLE_SUBSTITUTES[$version]:-}; do
          case $substitute in
            *=*) log "$line ($version): ${substitute%%=*} at ${substitute#*=} (the version machinery asks for is not served)"
                 go mod edit -replace "${substitute%%=*}=${substitute%%=*}@${substitute#*=}" || exit 1 ;;
            *@*) log "$line ($version): ${substitute%%@*} at ${substitute#*@} (the version machinery asks for is not served)"
                 gets+=("$substitute") ;;
          esac
        done &&
        go get "${gets[@]}" &&
        go build -trimpath -tags "$tags" -ldflags "-s -w" -o talos-oracle .
    ) || { log "$line ($version): NOT BUILT (see the error above)"; return 1; }
    echo "$source_hash" > "$work/source-hash"
    log "$line ($version): built"
  fi
  ln -sf "$binary" "$bin/talos-oracle-$line"
}

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("${TALOS_ORACLE_MACHINERY_VERSIONS[@]}")
failed=()
for version in "${versions[@]}"; do
  build "$version" || failed+=("$version")
done
if [ ${#failed[@]} -gt 0 ]; then
  log "not built: ${failed[*]}"
  exit 1
fi
log "binaries in $bin: $(cd "$bin" && ls talos-oracle-v* | tr '\n' ' ')"

#!/usr/bin/env bash
# Installs, once, the coding agents the agent tests drive, at pinned versions, into the cache:
# npm packages under agents/npm, aider in its own venv. Idempotent: a stamp per pinned set.
set -euo pipefail
cache="${XDG_CACHE_HOME:-$HOME/.cache}/specproxy/agents"
npm_pkgs=(
  "@anthropic-ai/claude-code@2.1.197"
  "@openai/codex@0.171.0"
  "opencode-ai@1.18.33"
  "@qwen-code/qwen-code@0.15.10"
  "@continuedev/cli@1.5.47"
)
aider_pkg="aider-chat==0.86.2"
mkdir -p "$cache"
stamp="$cache/.installed-$(printf '%s\n' "${npm_pkgs[@]}" "$aider_pkg" | sha256sum | cut -c1-12)"
[ -f "$stamp" ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
  echo "specproxy: the agent tests need Node.js and npm (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
echo "[specproxy] installing coding agents into $cache (once, about 2 GB)" >&2
npm install --prefix "$cache/npm" --no-audit --no-fund --loglevel=error "${npm_pkgs[@]}"
if [ ! -x "$cache/aider/bin/aider" ]; then
  python3 -m venv "$cache/aider"
fi
"$cache/aider/bin/pip" install --quiet --disable-pip-version-check "$aider_pkg"
touch "$stamp"
echo "[specproxy] agents installed" >&2

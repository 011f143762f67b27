# Sourced by scripts/setup.sh: pip's index settings (PIP_* variables, then its config files' install and global
# sections) exported as uv's, which reads none of pip's, unless uv's own are set. tests/unit/test_setup_variant.py
# checks it with a pip config of its own.

# uv_indexes_from_pip PIP_COMMAND...: exports UV_INDEX_URL, UV_EXTRA_INDEX_URL, UV_FIND_LINKS where pip has them.
uv_indexes_from_pip() {
  local pair uv_name key env_name value
  for pair in UV_INDEX_URL:index-url UV_EXTRA_INDEX_URL:extra-index-url UV_FIND_LINKS:find-links; do
    uv_name=${pair%%:*}; key=${pair#*:}
    [ -n "${!uv_name:-}" ] && continue
    env_name="PIP_${key^^}"; env_name=${env_name//-/_}
    value=${!env_name:-}
    [ -n "$value" ] || value=$("$@" config get "install.$key" 2>/dev/null || "$@" config get "global.$key" 2>/dev/null || true)
    value=$(echo "$value" | tr '\n' ' ' | xargs)  # pip's lists: newline or space separated; uv's: space
    if [ -n "$value" ]; then export "$uv_name=$value"; fi
  done
}

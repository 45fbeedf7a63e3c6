# Sourced by scripts/build-wheel.sh and scripts/test.sh: UV_ENV, pip's settings as uv's
# (`env "${UV_ENV[@]}" uv ...`). uv reads no pip.conf; pip's index variables are passed on
# where uv's own are unset. Only uv's commands get them, never the tests.
UV_ENV=()
uv_from_pip() { # uv_from_pip PIP_NAME UV_NAME...: pip's setting for uv, unless uv has its own
  local pip="$1" name
  shift
  for name in "$@"; do [ -z "${!name:-}" ] || return 0; done
  [ -z "${!pip:-}" ] || UV_ENV+=("$1=${!pip}")
}
uv_from_pip PIP_INDEX_URL UV_DEFAULT_INDEX UV_INDEX_URL
uv_from_pip PIP_EXTRA_INDEX_URL UV_INDEX UV_EXTRA_INDEX_URL
uv_from_pip PIP_NO_INDEX UV_NO_INDEX
uv_from_pip PIP_CERT SSL_CERT_FILE
if [ -z "${UV_FIND_LINKS:-}" ] && [ -n "${PIP_FIND_LINKS:-}" ]; then
  read -ra links <<<"${PIP_FIND_LINKS//$'\n'/ }" # pip splits on any white space, uv on commas
  UV_ENV+=("UV_FIND_LINKS=$(IFS=,; echo "${links[*]}")")
  unset links
fi
# pip takes the best version across its indexes; uv the first index's unless told.
[ -z "${PIP_EXTRA_INDEX_URL:-}" ] || UV_ENV+=("UV_INDEX_STRATEGY=${UV_INDEX_STRATEGY:-unsafe-best-match}")

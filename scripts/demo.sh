#!/usr/bin/env bash
# The main job (README command 1): placeholder smoke check until training lands.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -c "import roformer, data_pipeline, launcher; print('smoke: ok')"

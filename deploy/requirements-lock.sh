#!/usr/bin/env bash
# Writes requirements.lock: the runtime dependencies of pyproject.toml (and its build
# backend, setuptools), every version pinned with the sha256 of each of its files, for
# the Dockerfile's `pip install --require-hashes`. Run it after changing the
# dependencies in pyproject.toml; tests/system/test_deploy_image.py fails while the
# lock does not match them. Needs pip-tools (pip install pip-tools), Python 3.11 (the
# image's), and the package index (the local pip configuration is ignored, so the
# hashes are the index's own files).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP_CONFIG_FILE=/dev/null PIP_CONSTRAINT='' pip-compile --quiet --generate-hashes \
  --no-emit-index-url --no-emit-find-links --strip-extras --allow-unsafe \
  --build-deps-for wheel --output-file requirements.lock pyproject.toml
echo "wrote requirements.lock"

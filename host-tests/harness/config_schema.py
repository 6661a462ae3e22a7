"""The filter configuration's JSON Schema, from Kong's filter metadata that
`make dist` ships (scripts/dist/grpc_wasm.meta.json): the harnesses check
every configuration a test gives a filter against it, so that the schema
cannot fall behind what the filter takes."""

import json
import os

import jsonschema

from .paths import ROOT

META_PATH = os.path.join(ROOT, "scripts", "dist", "grpc_wasm.meta.json")

with open(META_PATH) as f:
    META = json.load(f)

VALIDATOR = jsonschema.Draft4Validator(META["config_schema"])

# Envoy's stats_tags for the labels the filter writes into metric names.
STATS_TAGS = [{"tag_name": p["label"], "regex": p["pattern"]} for p in META["metrics"]["label_patterns"]]


def errors(config):
    """What the schema says of `config`: each error with its path."""
    return sorted(f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
                  for e in VALIDATOR.iter_errors(config))


def check(config):
    """Raises when the schema refuses a configuration a test uses."""
    found = errors(config)
    if found:
        raise AssertionError(f"{META_PATH} refuses a configuration the tests use: {found}")

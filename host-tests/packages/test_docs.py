"""The documentation cannot drift from what runs: every code block in
README.md, CONTRIBUTING.md, CHANGELOG.md and docs/ is either a file of
examples/ (marked `<!-- example: path -->`, byte for byte, and a test runs
that file), or checked here by what it is: YAML and JSON parse, Lua and
JavaScript compile, `make` targets exist, Rust is a compiled example.
Relative links name files that exist."""

import glob
import json
import os
import re
import subprocess

import pytest
import yaml

from harness.config_schema import STATS_TAGS
from harness.paths import ROOT

PAGES = sorted(["README.md", "CONTRIBUTING.md", "CHANGELOG.md",
                *(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))])
BLOCK = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!-- example: (\S+) -->\s*$")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def blocks():
    for page in PAGES:
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        for m in BLOCK.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = MARKER.search(before)
            body = "\n".join(line.removeprefix(m.group("indent")) for line in m.group("body").split("\n"))
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(page, m.group("lang"), body, marker and marker.group(1), id=f"{page}:{line}")


def make_targets():
    with open(os.path.join(ROOT, "Makefile")) as f:
        return set(re.findall(r"^([a-z][\w-]*):", f.read(), re.M))


@pytest.mark.parametrize(("page", "lang", "body", "example"), list(blocks()))
def test_every_code_block_is_an_example_or_checked(page, lang, body, example, tmp_path):
    if example:
        with open(os.path.join(ROOT, example)) as f:
            assert body == f.read(), f"{page}: the block differs from {example}; copy the file in again"
        return
    if lang == "yaml":
        assert list(yaml.safe_load_all(body))
    elif lang == "json":
        json.loads(body)
    elif lang == "lua":
        (tmp_path / "block.lua").write_text(body)
        out = subprocess.run(["luacheck", "--no-config", "--std", "ngx_lua", "-q", str(tmp_path / "block.lua")],
                             capture_output=True, text=True)
        # 1: warnings (a fragment's unused locals); 2 and up: errors.
        assert out.returncode <= 1, out.stdout
    elif lang in ("js", "javascript"):
        (tmp_path / "block.mjs").write_text(body)
        subprocess.run(["node", "--check", str(tmp_path / "block.mjs")], check=True, capture_output=True)
    elif lang in ("sh", "console"):
        for target in re.findall(r"^\s*make ([a-z][\w-]*)", body, re.M):
            assert target in make_targets(), f"{page}: make {target} is no target"
    elif lang == "text" or lang == "":
        pass  # output, shown as it is printed
    else:
        pytest.fail(f"{page}: a ```{lang} block must be an example file (<!-- example: path -->)")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_name_files_that_exist(page):
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target))
        assert os.path.exists(path), f"{page} links to {target}, which does not exist"


def test_the_readme_is_a_front_page():
    with open(os.path.join(ROOT, "README.md")) as f:
        assert len(f.read().splitlines()) <= 220


def test_the_documented_stats_tags_are_the_filters():
    with open(os.path.join(ROOT, "examples", "envoy", "stats_tags.yaml")) as f:
        documented = yaml.safe_load(f)["stats_config"]["stats_tags"]
    assert documented == STATS_TAGS

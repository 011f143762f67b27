"""The versions the tests run on are the ones setup.cfg pins and docs/training.md names: the
numerical guarantees (loss normalisation, exact resume, fp16 loss scaling) are proven by the tests
for these releases only, so an upgrade shows up here first."""
from __future__ import annotations

from importlib.metadata import version

import pytest

from tests.support.helpers import REPO

GUARDED = ("torch", "deepspeed", "transformers")


@pytest.mark.parametrize("name", GUARDED)
def test_installed_version_is_pinned_and_documented(name):
    from packaging.requirements import Requirement
    from setuptools.config.setupcfg import read_configuration

    pins = {Requirement(r).name: Requirement(r) for r in
            read_configuration(REPO / "setup.cfg")["options"]["install_requires"]}
    installed = version(name)
    assert pins[name].specifier and pins[name].specifier.contains(installed), (name, installed, str(pins[name]))
    assert f"`{name} {installed.split('+')[0]}`" in (REPO / "docs" / "training.md").read_text(), \
        f"docs/training.md, 'Tested versions', does not name {name} {installed}"

"""Shared fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[1] / "models_store"


def make_models_without_terms(root: Path) -> Path:
    """A copy of models_store/ without the end-to-end terms, so GPU platforms have no host (framework)
    overhead model: what 'not modelled' looks like. (A copy: model paths may not resolve outside it.)"""
    import shutil
    d = root / "models_no_terms"
    if not d.exists():
        shutil.copytree(MODELS, d, ignore=shutil.ignore_patterns("framework_terms.json"))
    return d


@pytest.fixture(scope="session")
def models_without_terms(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models_without_terms(tmp_path_factory.mktemp("models"))

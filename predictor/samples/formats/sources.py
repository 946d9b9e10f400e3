"""The published sources (catalog/published_sources.json): which file is which source, its licence, framework
and facts."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from predictor import paths
from predictor.model.frameworks import FRAMEWORKS
from predictor.model.specs import (
    ARCHS,
    ATTENTION_IMPLS,
    PRECISIONS,
    RECOMPUTES,
    SCHEDULES,
)
from predictor.samples.formats.common import PUBLISHED_RULE_NAMES, SourceDefinitionError

PUBLISHED_SOURCES_FILE = paths.CATALOG_DIR / "published_sources.json"
# what a source's `memory` facts may set (predictor.step.memory.MemoryOptions fields, each true / false, cited)
MEMORY_FACTS = ("dropout",)


@lru_cache(maxsize=4)
def _load_source_definitions(path: str, mtime: float) -> dict[str, dict[str, Any]]:
    del mtime
    where = Path(path).name
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SourceDefinitionError(f"{where}: cannot read the source definitions: {exc}") from None
    sources = raw.get("sources") if isinstance(raw, dict) else None
    if not isinstance(sources, dict) or not sources:
        raise SourceDefinitionError(f"{where}: expected a mapping 'sources' of source id -> definition")
    out = {}
    for sid, d in sources.items():
        if str(sid).startswith("_"):
            continue
        if not isinstance(d, dict):
            raise SourceDefinitionError(f"{where}: sources.{sid}: expected a mapping")
        fw = d.get("framework")
        if fw not in FRAMEWORKS:
            raise SourceDefinitionError(f"{where}: sources.{sid}.framework: unknown framework {fw!r}; "
                                        f"valid: {', '.join(FRAMEWORKS)}")
        match = d.get("match")
        if not isinstance(match, dict) or not ({"kind", "row_source_prefix"} & set(match)):
            raise SourceDefinitionError(f"{where}: sources.{sid}.match: give 'kind' and/or 'row_source_prefix'")
        rules = d.get("rules")
        if rules is not None and rules not in PUBLISHED_RULE_NAMES:
            raise SourceDefinitionError(f"{where}: sources.{sid}.rules: unknown rule set {rules!r}; "
                                        f"known: {', '.join(PUBLISHED_RULE_NAMES)}")
        allowed: tuple[str, ...]
        for key, allowed in (("precision", PRECISIONS), ("recompute", RECOMPUTES)):
            for k, v in (d.get(key) or {}).items():
                if v not in allowed:
                    raise SourceDefinitionError(f"{where}: sources.{sid}.{key}.{k}: {v!r} is not one of "
                                                f"{', '.join(allowed)}")
        for name, fact in (d.get("memory") or {}).items():
            if name not in MEMORY_FACTS or not isinstance(fact, dict) or not isinstance(fact.get("value"), bool) \
                    or not fact.get("cite"):
                raise SourceDefinitionError(f"{where}: sources.{sid}.memory.{name}: give one of "
                                            f"{', '.join(MEMORY_FACTS)} with a true / false 'value' and its 'cite'")
        facts = d.get("facts") or {}
        for name, fact in facts.items():
            if not isinstance(fact, dict) or "value" not in fact or not fact.get("cite"):
                raise SourceDefinitionError(f"{where}: sources.{sid}.facts.{name}: give a 'value' and its 'cite'")
        for name, allowed in (("arch", ARCHS), ("attention", ATTENTION_IMPLS), ("schedule", SCHEDULES)):
            if name in facts and facts[name]["value"] not in allowed:
                raise SourceDefinitionError(f"{where}: sources.{sid}.facts.{name}: {facts[name]['value']!r} "
                                            f"is not one of {', '.join(allowed)}")
        out[str(sid)] = {**d, "source_id": str(sid)}
    return out


def load_source_definitions(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The source definitions (`predictor/catalog/published_sources.json`), validated: source id ->
    definition. A wrong definition (an unknown framework, ...) raises SourceDefinitionError."""
    p = Path(path) if path is not None else PUBLISHED_SOURCES_FILE
    try:
        mtime = p.stat().st_mtime
    except OSError as exc:
        raise SourceDefinitionError(f"{p}: cannot read the source definitions: {exc}") from None
    return _load_source_definitions(str(p), mtime)


def match_source(defs: dict[str, dict[str, Any]], *, kind: str | None = None,
                 row_source: str | None = None) -> dict[str, Any] | None:
    """The definition whose `match` fits a file kind or a row's source text."""
    for d in defs.values():
        m = d["match"]
        if kind is not None and m.get("kind") == kind:
            return d
        prefixes = m.get("row_source_prefix")
        prefixes = [prefixes] if isinstance(prefixes, str) else list(prefixes or [])
        if row_source and any(str(row_source).startswith(p) for p in prefixes):
            return d
    return None


def legacy_source_rules() -> list[tuple[str, str, str]]:
    """(source prefix, source_id, framework) used to fill stores ingested before those columns existed."""
    out = []
    for d in load_source_definitions().values():
        m = d["match"]
        prefixes = m.get("row_source_prefix") or m.get("legacy_source_prefix") or []
        for p in [prefixes] if isinstance(prefixes, str) else prefixes:
            out.append((p, d["source_id"], d["framework"]))
    return out

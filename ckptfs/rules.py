"""Which directories are checkpoint groups, and which events complete them.

A *group* is a directory that holds one checkpoint.  A directory becomes a
group when ckptfs sees a file written into it (or it being created) and one
rule matches it.  A group is *sealed* by the first completion event its rule
allows:

* ``markers``: a file with one of these names lands (is committed, or is
  renamed into place) directly inside the group;
* ``pointer``: a file with one of these names is committed in the group's
  parent directory and its content names the group (``latest`` holding
  ``global_step10``; Megatron's ``latest_checkpointed_iteration.txt`` holding
  ``10`` names ``iter_0000010``);
* ``unfinished``: a sibling marker ``<group><suffix>`` is removed (NeMo);
* a directory renamed into place (Orbax's temporary step directory);
* ``idle_seal``: every handle in the group is closed and nothing was written
  for ``idle_seconds`` (only for rules that have no marker, no pointer and no
  unfinished marker, so a writer killed between two files of a framework
  that does have a marker is never mistaken for a finished save);
* explicit control: ``ckptfs seal PATH`` or ``setfattr -n user.ckptfs.seal``.

Rules are tried in order; the first whose ``pattern`` (a regular expression
over the directory's base name) matches wins.  Content rules (``contains``)
match a directory when a file with a matching name is written in it (DCP
shards).  Users add rules in ``.ckptfs.toml`` at the mount root; user rules
come before the defaults.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

CONFIG_NAME = ".ckptfs.toml"
DEFAULT_IDLE_SECONDS = 30.0
_STEP_RE = re.compile(r"(\d+)(?!.*\d)")


@dataclass(frozen=True)
class Rule:
    """One group rule.  ``pattern`` matches a directory's base name."""

    name: str
    pattern: str = ""
    contains: str = ""  # regex over a file's base name that makes its directory a group
    markers: tuple[str, ...] = ()
    pointers: tuple[str, ...] = ()
    pointer_format: str = "{name}"  # how a pointer's content maps to a directory name
    unfinished_suffix: str = ""
    idle_seal: bool = False
    _re: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    _contains_re: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_re", re.compile(self.pattern) if self.pattern else None)
        object.__setattr__(self, "_contains_re", re.compile(self.contains) if self.contains else None)

    def matches_dir(self, base: str) -> bool:
        return self._re is not None and self._re.fullmatch(base) is not None

    def matches_content(self, filename: str) -> bool:
        return self._contains_re is not None and self._contains_re.fullmatch(filename) is not None

    @property
    def has_completion_event(self) -> bool:
        return bool(self.markers or self.pointers or self.unfinished_suffix)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pattern": self.pattern, "contains": self.contains,
                "markers": list(self.markers), "pointers": list(self.pointers),
                "pointer_format": self.pointer_format, "unfinished_suffix": self.unfinished_suffix,
                "idle_seal": self.idle_seal}


DEFAULT_RULES: tuple[Rule, ...] = (
    # Hugging Face Trainer: weights, optimizer, scheduler, rng, then trainer_state.json.
    Rule("hf-trainer", pattern=r"checkpoint-\d+", markers=("trainer_state.json",)),
    # DeepSpeed: per-rank files under global_stepN/, then `latest` naming the tag.
    Rule("deepspeed", pattern=r"global_step\d+", pointers=("latest",)),
    # Megatron-LM / NeMo-Megatron: iter_0000010/ then latest_checkpointed_iteration.txt = "10".
    Rule("megatron", pattern=r"iter_\d{7}", pointers=("latest_checkpointed_iteration.txt",),
         pointer_format="iter_{int:07d}"),
    # torch.distributed.checkpoint: *.distcp shards, then .metadata (tmp + rename) by the coordinator.
    Rule("dcp", contains=r"__\d+_\d+\.distcp", markers=(".metadata",)),
    # Orbax: <step>.orbax-checkpoint-tmp-<ts> renamed to <step>; or commit_success.txt.
    Rule("orbax", pattern=r"\d+", markers=("commit_success.txt",)),
    # NeMo: <name> with a sibling <name>-unfinished marker removed when done.
    Rule("nemo", pattern=r".*step=\d+.*", unfinished_suffix="-unfinished", markers=(".metadata",)),
    # Generic step directories: sealed by a DCP .metadata, a COMMIT file, a rename, or idleness.
    Rule("step-dir", pattern=r"(?:step|epoch|ckpt|checkpoint|iter)[-_]?\d+", markers=(".metadata", "COMMIT"),
         idle_seal=True),
)

# Names that must never make a group (temporary names a directory is renamed from).
TMP_DIR_RE = re.compile(r".*\.orbax-checkpoint-tmp-\d+|tmp-checkpoint-\d+")


def step_of(name: str) -> int | None:
    """The step number in a group's name: its last run of digits."""
    m = _STEP_RE.search(name)
    return int(m.group(1)) if m else None


@dataclass
class RuleSet:
    rules: tuple[Rule, ...] = DEFAULT_RULES
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    keep_last: int = 0  # 0: no retention
    keep_every: int = 0  # milestone: also keep groups whose step % keep_every == 0
    source: str = "defaults"

    def rule(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)

    def dir_rule(self, base: str) -> Rule | None:
        if TMP_DIR_RE.fullmatch(base):
            return None
        return next((r for r in self.rules if r.matches_dir(base)), None)

    def content_rule(self, filename: str) -> Rule | None:
        return next((r for r in self.rules if r.matches_content(filename)), None)

    def pointer_names(self) -> set[str]:
        return {p for r in self.rules for p in r.pointers}

    def pointer_target(self, pointer_name: str, content: bytes) -> list[str]:
        """Directory names (relative to the pointer's directory) a pointer's content may name."""
        try:
            text = content.decode().strip()
        except UnicodeDecodeError:
            return []
        if not text or "\n" in text or len(text) > 4096:
            return []
        out: list[str] = []
        for r in self.rules:
            if pointer_name not in r.pointers:
                continue
            if "{int" in r.pointer_format:
                if text.isdigit():
                    out.append(r.pointer_format.format(int=int(text)))
            else:
                out.append(r.pointer_format.format(name=text.rstrip("/")))
        return out

    def unfinished_target(self, filename: str) -> str | None:
        for r in self.rules:
            if r.unfinished_suffix and filename.endswith(r.unfinished_suffix):
                return filename[: -len(r.unfinished_suffix)]
        return None


class ConfigError(ValueError):
    pass


def _load_toml(data: bytes) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads(data.decode())


def parse_config(data: bytes, source: str = CONFIG_NAME) -> RuleSet:
    """Parse ``.ckptfs.toml``.  Raises ConfigError with a clear message.

    Format::

        idle_seal_seconds = 30
        keep_last = 3          # retention: newest K sealed groups per directory
        keep_every = 1000      # ... plus every group whose step is a multiple of N

        [[group]]
        name = "my-layout"
        pattern = "ckpt_\\\\d+"      # regex over the directory's base name
        marker = "DONE"            # or markers = [...]
        pointer = "LATEST"         # or pointers = [...]
        idle_seal = false
    """
    try:
        doc = _load_toml(data)
    except Exception as e:  # tomllib.TOMLDecodeError and UnicodeDecodeError
        raise ConfigError(f"{source}: {e}") from None
    user: list[Rule] = []
    for i, g in enumerate(doc.get("group", [])):
        if not isinstance(g, dict) or not (g.get("pattern") or g.get("contains")):
            raise ConfigError(f"{source}: [[group]] #{i + 1} needs a 'pattern' or 'contains'")
        markers = tuple(g.get("markers", ())) + ((g["marker"],) if "marker" in g else ())
        pointers = tuple(g.get("pointers", ())) + ((g["pointer"],) if "pointer" in g else ())
        try:
            user.append(Rule(
                name=str(g.get("name", f"user-{i + 1}")), pattern=str(g.get("pattern", "")),
                contains=str(g.get("contains", "")), markers=markers, pointers=pointers,
                pointer_format=str(g.get("pointer_format", "{name}")),
                unfinished_suffix=str(g.get("unfinished_suffix", "")),
                idle_seal=bool(g.get("idle_seal", not (markers or pointers)))))
        except re.error as e:
            raise ConfigError(f"{source}: [[group]] #{i + 1}: bad regular expression: {e}") from None
    try:
        return RuleSet(rules=tuple(user) + DEFAULT_RULES,
                       idle_seconds=float(doc.get("idle_seal_seconds", DEFAULT_IDLE_SECONDS)),
                       keep_last=int(doc.get("keep_last", 0)), keep_every=int(doc.get("keep_every", 0)),
                       source=source)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: {e}") from None


def parent_and_base(path: str) -> tuple[str, str]:
    p = PurePosixPath(path)
    par = str(p.parent)
    return ("" if par == "." else par), p.name

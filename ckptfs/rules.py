"""Which directories are checkpoint groups, and which events complete them.

A *group* is a directory that holds one checkpoint.  A directory becomes a
group only on evidence that a checkpoint is being written there, never because
of its name alone (an ordinary directory named ``2024``, ``7`` or ``step_5``
stays an ordinary directory of ordinary committed files):

* a file matching the rule's ``signature`` (the files that framework writes:
  ``optimizer.pt``, ``*.distcp``, ``model.safetensors``...) is created in a
  directory whose name matches the rule's ``pattern`` (or in a subdirectory of
  it, up to ``SIGNATURE_DEPTH`` levels: Megatron's ``iter_N/mp_rank_00/``), or
  a file matching a ``contains`` rule is created anywhere (DCP shards);
* a directory whose name matches is renamed into place from a temporary name
  (Orbax) or holding signature files;
* a directory whose name matches is made by a process that wrote files into a
  sibling group (a trainer starting its next save): a save killed before its
  first file then leaves evidence, not an empty directory resume would pick;
* explicit control (``ckptfs seal``).

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

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

CONFIG_NAME = ".ckptfs.toml"
DEFAULT_IDLE_SECONDS = 30.0
_STEP_RE = re.compile(r"(\d+)(?!.*\d)")
SIGNATURE_DEPTH = 2  # a signature file this many directories below a candidate still opens it (Megatron)


# Files of the common checkpoint formats: the evidence that a directory named like a step
# directory holds a checkpoint.  Deliberately not .txt, .json, .log, .csv or extensionless names
# (logs, git objects, notes).
CHECKPOINT_FILES = (r".*\.(?:pt|pth|bin|safetensors|ckpt|distcp|npy|npz|msgpack|h5|hdf5|pkl|pickle|tar|"
                    r"orbax|ocdbt|zarr|gguf|onnx|tflite|keras|model|params|state)|\.metadata(?:\.tmp)?")
# Completion markers real writers use (the seed paper's COMMIT.json, Orbax's commit_success.txt,
# Hadoop/Spark's _SUCCESS, ...); a step directory waits for one once a sibling was sealed by one.
STEP_MARKERS = (".metadata", "COMMIT", "COMMIT.json", "commit_success.txt", "DONE", "_SUCCESS", "COMPLETE",
                "COMPLETED")
HF_FILES = (r"trainer_state\.json|optimizer\.(?:pt|bin)|scheduler\.pt|scaler\.pt|rng_state(?:_\d+)?\.pth|"
            r"training_args\.bin|config\.json|generation_config\.json|(?:pytorch_)?model.*\.(?:safetensors|bin)|"
            r".*\.safetensors\.index\.json|adapter_(?:model|config)\..*|\.tmp\w+")
ORBAX_FILES = (r"commit_success\.txt|_METADATA|_CHECKPOINT_METADATA|_sharding|manifest\.ocdbt|"
               r"ocdbt\.process_\d+|.*\.orbax|descriptor\.pbtxt|array_metadatas")



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
    signature: str = CHECKPOINT_FILES  # regex over a file's base name: the files this layout writes
    on_mkdir: bool = True  # a directory it names, made by mkdir, is a tentative group (issue 10)
    _re: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    _contains_re: re.Pattern[str] | None = field(default=None, compare=False, repr=False)
    _sig_re: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_re", re.compile(self.pattern) if self.pattern else None)
        object.__setattr__(self, "_contains_re", re.compile(self.contains) if self.contains else None)
        object.__setattr__(self, "_sig_re", re.compile(self.signature) if self.signature else None)

    def signs(self, filename: str) -> bool:
        """Whether a file named ``filename`` is one this layout writes (evidence of a save), or one of
        its completion markers."""
        return (filename in self.markers or self.matches_content(filename)
                or (self._sig_re is not None and self._sig_re.fullmatch(filename) is not None))

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
                "idle_seal": self.idle_seal, "signature": self.signature}


DEFAULT_RULES: tuple[Rule, ...] = (
    # Hugging Face Trainer: weights, optimizer, scheduler, rng, then trainer_state.json.
    Rule("hf-trainer", pattern=r"checkpoint-\d+", markers=("trainer_state.json",), signature=HF_FILES),
    # DeepSpeed: per-rank files under global_stepN/, then `latest` naming the tag.
    Rule("deepspeed", pattern=r"global_step\d+", pointers=("latest",)),
    # Megatron-LM / NeMo-Megatron: iter_0000010/ then latest_checkpointed_iteration.txt = "10".
    Rule("megatron", pattern=r"iter_\d{7}", pointers=("latest_checkpointed_iteration.txt",),
         pointer_format="iter_{int:07d}"),
    # torch.distributed.checkpoint: *.distcp shards, then .metadata (tmp + rename) by the coordinator.
    Rule("dcp", contains=r"__\d+_\d+\.distcp", markers=(".metadata",)),
    # Orbax: <step>.orbax-checkpoint-tmp-<ts> renamed to <step>; or commit_success.txt.
    # (on_mkdir=False: "N" is too common a name, .git/objects/42, logs/2024; Orbax renames a tmp dir)
    Rule("orbax", pattern=r"\d+", markers=("commit_success.txt",), signature=ORBAX_FILES, on_mkdir=False),
    # NeMo: <name> with a sibling <name>-unfinished marker removed when done.
    Rule("nemo", pattern=r".*step=\d+.*", unfinished_suffix="-unfinished", markers=(".metadata",)),
    # Generic step directories: sealed by a DCP .metadata, a COMMIT file, a rename, or idleness.
    Rule("step-dir", pattern=r"(?:step|epoch|ckpt|checkpoint|iter)[-_]?\d+", markers=STEP_MARKERS,
         idle_seal=True),
)

# Temporary files a save writes before renaming them into place (the already-atomic writer's
# ``model.bin.tmp``, safetensors' ``.tmpXXXX``, ``x.part``): a step directory holding only these
# holds no checkpoint yet (GroupEngine._judge_tentative).
TEMP_FILE_RE = re.compile(r".+\.(?:tmp|temp|part|partial)\w*|\.tmp\w*|tmp\w*")
# The name a temporary file of an already-atomic writer stands for (``model.pt.tmp`` -> ``model.pt``,
# ``latest.tmp`` -> ``latest``): a rename between the two is finished by recovery from the disk
# (recovery.finish_temp_renames, R2), so it journals no synced intent (fs.py I8)
TEMP_OF_RE = re.compile(r"(.+)\.(?:tmp|temp|part|partial)\w*")
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
        """The first rule whose pattern matches a directory's base name (a *candidate*: it becomes a
        group only on evidence, see the module docstring)."""
        if TMP_DIR_RE.fullmatch(base):
            return None
        return next((r for r in self.rules if r.matches_dir(base)), None)

    def evidence_rule(self, dirbase: str, filename: str) -> Rule | None:
        """The first rule whose pattern matches ``dirbase`` and which ``filename`` is evidence for."""
        if TMP_DIR_RE.fullmatch(dirbase):
            return None
        return next((r for r in self.rules if r.matches_dir(dirbase) and r.signs(filename)), None)

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
    try:
        return _rules_of(doc, source)
    except (TypeError, ValueError, AttributeError, OverflowError) as e:  # a value of the wrong kind
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{source}: {e}") from None


def _rules_of(doc: dict[str, Any], source: str) -> RuleSet:
    user: list[Rule] = []
    groups = doc.get("group", [])
    if not isinstance(groups, list):
        raise ConfigError(f"{source}: 'group' must be an array of tables ([[group]])")
    for i, g in enumerate(groups):
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
                idle_seal=bool(g.get("idle_seal", not (markers or pointers))),
                # a user rule names its own layout: any file is evidence unless it says otherwise
                signature=str(g.get("signature", ".*"))))
        except re.error as e:
            raise ConfigError(f"{source}: [[group]] #{i + 1}: bad regular expression: {e}") from None
    idle = float(doc.get("idle_seal_seconds", DEFAULT_IDLE_SECONDS))
    keep_last, keep_every = int(doc.get("keep_last", 0)), int(doc.get("keep_every", 0))
    if not math.isfinite(idle) or idle < 0 or keep_last < 0 or keep_every < 0:
        raise ConfigError(f"{source}: idle_seal_seconds, keep_last and keep_every must be finite and >= 0")
    return RuleSet(rules=tuple(user) + DEFAULT_RULES, idle_seconds=idle, keep_last=keep_last,
                   keep_every=keep_every, source=source)


def parent_and_base(path: str) -> tuple[str, str]:
    """(parent, name) of a normalized relative path (no pathlib object per call: every new file
    asks, issue 27)."""
    par, _, name = path.rstrip("/").rpartition("/")
    return par.rstrip("/"), name

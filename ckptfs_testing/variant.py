"""Run ``ckptfs`` with one known-bad rule variant: the controls of the evidence checker
(:mod:`ckptfs_testing.evidence`), which must catch each of them.

Usage: ``python -m ckptfs_testing.variant VARIANT ckptfs-arguments...`` (``good`` runs ckptfs as is).

* ``seal-on-flush``: a FLUSH commits even where the process still holds the file open (the rule
  "seal on the last close", fs.CkptFS.flush, is off): a shell's ``echo done > COMMIT`` seals an
  empty marker, its bytes come after.
* ``ignore-exits``: how a group's writers ended is not evidence (GroupEngine._writer_failed says
  nothing): a writer killed between two files of an idle-seal layout leaves it sealed as good.
* ``no-sealed-view``: a re-save of a sealed group shows other jobs what is at its paths (RS1 off,
  engine/sealedview.py): the control of ``scripts/resave_race_campaign``.

Test tooling only: the product never imports this module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

VARIANTS = ("good", "seal-on-flush", "ignore-exits", "no-sealed-view")
EVIDENCE_VARIANTS = ("good", "seal-on-flush", "ignore-exits")  # what scripts/evidence_check runs


def _seal_on_flush() -> None:
    from ckptfs import procinfo

    procinfo.holds_open = lambda pid, path: False


def _ignore_exits() -> None:
    from ckptfs.engine.groups import GroupEngine

    GroupEngine._writer_failed = lambda self, g: ""  # type: ignore[method-assign]


def _no_sealed_view() -> None:
    from ckptfs.engine.sealedview import SealedView

    SealedView.files = lambda self, g: None  # type: ignore[method-assign]
    SealedView.applies = staticmethod(lambda g: False)  # type: ignore[method-assign]


PATCHES: dict[str, Callable[[], None]] = {"seal-on-flush": _seal_on_flush, "ignore-exits": _ignore_exits,
                                          "no-sealed-view": _no_sealed_view}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in VARIANTS:
        print(f"usage: python -m ckptfs_testing.variant {{{','.join(VARIANTS)}}} ARGS...", file=sys.stderr)
        return 2
    variant = sys.argv[1]
    if variant in PATCHES:
        PATCHES[variant]()
    from ckptfs.cli.parser import main as ckptfs_main

    return ckptfs_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

"""How the benchmarks write their figures."""

from __future__ import annotations

import json
import sys


def write_json(result: object, target: str | None) -> None:
    """Write ``result`` as JSON to the file ``target``, to stdout for ``-``, nowhere for None or ``""``."""
    if target == "-":
        json.dump(result, sys.stdout, indent=2)
        print()
    elif target:
        with open(target, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)

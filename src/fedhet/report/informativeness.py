"""Whether a client's updates carried information, from what the server recorded (``metrics.jsonl``).

The audit's free-rider finding (fedhet.report.audit, docs/audit.md). A free rider sends no real update: the
model it was sent plus noise (Lin et al., arXiv:1911.12560, 2019; Fraboni et al., AISTATS 2021), the model
unchanged (``stale``), or one update re-sent every round (``replay``). Noise of any size, and nothing, are
orthogonal to the other updates of the round (``update_alignment``: fedhet.engine.alignment): its cosine with
them is that of a random direction, of spread 1/√d over the d weights compared (``update_alignment_size``),
while an honest update shares some of their direction, many times that. So the finding reads |cos| × √d, the
cosine in units of chance, which holds for a model of 2,000 weights as for one of 55,000. A re-sent update
repeats its norm round after round, which an honest client's training never does to 5 digits. Only rounds
in which the client's update was kept count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Which quantile of a client's |cos| × √d over its kept rounds the finding reads: of the median, mean, 75th
#: and 90th percentile and maximum, the median separated the honest clients from the noise of the study's
#: quiet free riders best (docs/audit.md).
ALIGNMENT_QUANTILE = 0.5


def informativeness(
    lines: Sequence[dict[str, Any]], repeat_tolerance: float = 1e-5
) -> dict[int, dict[str, Any]]:
    """Per client, what its kept updates (the rounds whose ``clients`` name it) say about whether they carry
    information: ``rounds`` with an alignment recorded and ``alignment``, the median over them of
    |cos(Δ_i, Σ_{j≠i} Δ_j)| × √d (``update_alignment`` and ``update_alignment_size``: noise points nowhere,
    about 1 in these units in every round; an honest update shares some of the others' direction, or its
    opposite, in some rounds at least);
    ``pairs`` of consecutive kept rounds with a norm recorded and ``repeated``, how many of them have norms
    within ``repeat_tolerance`` of each other (relative: one update re-sent). Runs recorded before
    ``update_alignment`` existed have ``rounds`` 0."""
    out: dict[int, dict[str, Any]] = {}
    last_norm: dict[int, float] = {}
    for ln in lines:
        kept = {int(c) for c in ln.get("clients") or []}
        scale = math.sqrt(float(ln.get("update_alignment_size") or 0))
        for c, v in (ln.get("update_alignment") or {}).items() if scale else ():
            if int(c) in kept:
                out.setdefault(int(c), _no_rounds())["cosines"].append(abs(float(v)) * scale)
        for c, v in (ln.get("update_norms") or {}).items():
            cid, norm = int(c), float(v)
            if cid not in kept:
                continue
            info = out.setdefault(cid, _no_rounds())
            if cid in last_norm:
                info["pairs"] += 1
                top = max(norm, last_norm[cid])
                info["repeated"] += int(top > 0 and abs(norm - last_norm[cid]) <= repeat_tolerance * top)
            last_norm[cid] = norm
    for info in out.values():
        cosines = info.pop("cosines")
        info["rounds"] = len(cosines)
        info["alignment"] = float(np.quantile(cosines, ALIGNMENT_QUANTILE)) if cosines else math.nan
    return out


def _no_rounds() -> dict[str, Any]:
    return {"cosines": [], "pairs": 0, "repeated": 0}


def sends_no_information(
    lines: Sequence[dict[str, Any]],
    no_alignment: float = 2.0,
    repeat_tolerance: float = 1e-5,
    min_rounds: int = 3,
) -> dict[int, str]:
    """The clients whose kept updates carried no information (:func:`informativeness`), with the evidence:
    over at least ``min_rounds`` rounds, a median of |cos| × √d below ``no_alignment`` (noise of
    any size, or no update at all), or a norm repeated round after round in at least half of the consecutive
    pairs (the same update re-sent)."""
    found = {}
    for cid, info in sorted(informativeness(lines, repeat_tolerance).items()):
        if info["rounds"] >= min_rounds and info["alignment"] == 0.0:
            found[cid] = (
                "its updates are empty (norm 0, so |cos| 0) in at least half of its "
                f"{info['rounds']} kept rounds"
            )
        elif info["rounds"] >= min_rounds and info["alignment"] < no_alignment:
            found[cid] = (
                "its updates point nowhere: the median of |cos| with the round's other updates, "
                f"in units of a random direction's (1/√d), is {info['alignment']:.2f} over {info['rounds']} "
                f"kept rounds (< {no_alignment:g}; an honest update shares the others' direction)"
            )
        elif info["pairs"] >= min_rounds and info["repeated"] >= info["pairs"] / 2:
            found[cid] = (
                f"it re-sends one update: its norm repeated (relative change ≤ {repeat_tolerance:g}) in "
                f"{info['repeated']} of {info['pairs']} consecutive kept rounds"
            )
    return found

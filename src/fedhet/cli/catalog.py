"""``fedhet methods`` and ``fedhet experiments``: what fedhet ships, with what each needs."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("methods", help="list the methods, their parameters and what they need")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("experiments", help="list the shipped experiments (fedhet run NAME runs one)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_experiments)


def cmd_methods(args: argparse.Namespace) -> int:
    from fedhet.algorithms import accepted_params, build_strategy, describe, method_names, strategy_class
    from fedhet.models.registry import MODEL_NEEDS

    for name in method_names():
        params = ", ".join(accepted_params(strategy_class(name))) or "-"
        print(f"{name}: {describe(name)}\n    params: {params}")
        strategy = build_strategy(name)
        needs = [MODEL_NEEDS[n].split(":")[0] for n in sorted(strategy.model_needs)]
        inputs = {
            "validation": "a server validation set",
            "reference_contributions": "every client's standalone accuracy (a cached pre-pass)",
        }
        needs = [inputs.get(r, r) for r in sorted(strategy.requirements())] + needs
        if needs:
            print(f"    needs: {'; '.join(needs)}")
        defaults = strategy.config_defaults()
        if defaults:
            shown = ", ".join(f"{k} = {v!r}" for k, v in defaults.items())
            print(f"    applies, where left at fedhet's default: {shown}")
    return 0


def cmd_experiments(args: argparse.Namespace) -> int:
    from fedhet.config import describe_experiment, experiment_names

    names = experiment_names()
    if args.json:
        print(json.dumps([{"name": n, "description": describe_experiment(n)} for n in names]))
        return 0
    for name in names:
        print(f"{name}: {describe_experiment(name)}")
    print(f"\n{len(names)} experiments; run one with `fedhet run NAME` (add --rounds N for a short run)")
    return 0

"""fedhet on Flower: a ServerApp that drives any fedhet Strategy over Flower's Message API, and a ClientApp
that runs ``fedhet.engine.client.run_client`` on each node's own data (the ``fedhet[flower]`` extra).

- ``fedhet.flower.server``: :func:`make_server_app`, :func:`run_flower_simulation`, the Flower transport;
- ``fedhet.flower.client``: :func:`make_client_app`;
- ``fedhet.flower.records``: the messages as Flower records, the public protocol for a ClientApp of your own
  (``content_to_instruction``, ``reply_to_content``, ``description_to_content``; docs/flower.md);
- ``fedhet.flower.server_log``: the ServerApp's lines in Flower's log (``flwr run --stream``, ``flwr log``);
- ``fedhet.flower.lifecycle``: stop, ``resume`` and ``overwrite`` of a Flower run, and nodes Flower reports
  offline;
- ``fedhet.flower.site_tables``: the server's side of nodes that read their own tables (``node-tables``);
- ``fedhet.flower.sites``: each site's data from a split (``fedhet partition --export-sites``);
- ``examples/flower-app``: ``server_app`` / ``client_app`` objects for ``flwr run`` (see docs/flower.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator

from fedhet.errors import ConfigError


def require_flower() -> None:
    """Raise a ConfigError saying how to install Flower when it is missing."""
    if importlib.util.find_spec("flwr") is None:
        raise ConfigError(
            "Flower is not installed: pip install 'fedhet[flower]' (flwr with its simulation extra, Ray)"
        )


@contextlib.contextmanager
def flower_quiet(quiet: bool = True) -> Iterator[None]:
    """While the block runs (``--quiet``), Flower's and Ray's log records below WARNING are not made in this
    process: their loggers are held at WARNING, then restored; warnings and errors still show."""
    if not quiet:
        yield
        return
    if importlib.util.find_spec("flwr") is not None:
        import flwr.common.logger  # noqa: F401 (Flower sets its logger to DEBUG on import: before, not after)
    loggers = [logging.getLogger(name) for name in ("flwr", "ray")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)

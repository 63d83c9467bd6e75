"""What a run's outputs call its clients and classes: one :class:`RunNames` per run, made from its federation
(client i of a ``sites`` split is site ``dataset.sites[i]``; the classes are the data set's names), written
into ``summary.json`` (``client_names``, ``class_names``) and read back from it by every output (the CLI
tables, the report, the CSVs, the audit), so no output works the names out again.

One readable form everywhere: a client is ``1 (south)`` where the data name its site, else ``1``; a class is
its name (``malignant``, ``T-shirt/top``; ``3`` for digits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The summary.json keys of the names (absent from runs recorded before they were written).
CLIENT_NAMES_KEY = "client_names"
CLASS_NAMES_KEY = "class_names"


@dataclass(frozen=True)
class RunNames:
    """A run's client names (site names of a ``sites`` split, in client order; empty: clients have only
    their numbers) and class names (empty: classes have only their numbers)."""

    clients: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()

    @classmethod
    def of_data(cls, dataset: Any, split: str, num_clients: int) -> RunNames:
        """The names of a federation of ``num_clients`` clients of ``dataset`` split by ``split``: sites only
        for the ``sites`` split (client i holds the rows of site i, fedhet.data.splits.sites), where no other
        split has them."""
        sites = tuple(dataset.sites) if split == "sites" and dataset.train_sites is not None else ()
        return cls(clients=sites[:num_clients], classes=tuple(str(c) for c in dataset.classes))

    @classmethod
    def of_summary(cls, summary: Mapping[str, Any], classes: Sequence[str] | None = None) -> RunNames:
        """The names a run's summary recorded; ``classes`` (partition.json's) for a run recorded before the
        summary kept them. A run recorded without names numbers its clients and classes."""
        clients = summary.get(CLIENT_NAMES_KEY) or ()
        recorded = summary.get(CLASS_NAMES_KEY) or classes or ()
        return cls(clients=tuple(str(c) for c in clients), classes=tuple(str(c) for c in recorded))

    def to_summary(self) -> dict[str, list[str] | None]:
        """The summary.json entries: the client names (null where clients have only numbers), the classes."""
        return {
            CLIENT_NAMES_KEY: list(self.clients) if self.clients else None,
            CLASS_NAMES_KEY: list(self.classes),
        }

    def site(self, cid: int) -> str:
        """Client ``cid``'s site name, or "" where the data name none."""
        return self.clients[cid] if 0 <= cid < len(self.clients) else ""

    def client(self, cid: int) -> str:
        """Client ``cid`` as outputs write it: ``1 (south)``, or ``1`` without a site name."""
        site = self.site(cid)
        return f"{cid} ({site})" if site else str(cid)

    def class_name(self, k: int) -> str:
        """Class ``k`` as outputs write it: its name, or its number where the run recorded no names."""
        return self.classes[k] if 0 <= k < len(self.classes) else str(k)

    def client_labels(self, n: int) -> list[str]:
        """:meth:`client` of clients 0..n-1."""
        return [self.client(i) for i in range(n)]

    def class_labels(self, k: int) -> list[str]:
        """:meth:`class_name` of classes 0..k-1."""
        return [self.class_name(c) for c in range(k)]

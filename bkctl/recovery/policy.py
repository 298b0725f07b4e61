"""The placement policy of a command or daemon: Java's keys from its properties (`--conf FILE`,
`BKCTL_CONF`), with the rack source they name over the cluster's metadata store.

Above client/ (the policy) and metadata/ (the rack sources), so the one place that joins them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from bkctl.client.placement import Locate, Placement, settings_from_properties
from bkctl.metadata.racks import source_from_properties
from bkctl.metadata.store import MetadataStore


def placement_from_properties(
    props: Mapping[str, str], store: MetadataStore | None, rng: random.Random | None = None
) -> Placement:
    """Placement per `ensemblePlacementPolicy` and its keys; the rack source only for an aware one."""
    settings = settings_from_properties(props)
    locate: Locate | None = None
    if settings.kind != "default":
        source = source_from_properties(props, store)
        locate = source if callable(source) else None
    return Placement(settings, locate, rng)

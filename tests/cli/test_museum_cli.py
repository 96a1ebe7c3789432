"""The CLI's torch-free copies of museum data match the museum itself."""

from __future__ import annotations

from kvledger.cli import hunt as hunt_cli
from kvledger.cli import museum_index
from kvledger.museum.machines import MACHINES


def test_the_museum_index_matches_the_catalogue() -> None:
    """After changing an exhibit: ``python -m kvledger.cli.museum_index`` regenerates the copy."""
    assert museum_index.build() == museum_index.EXHIBITS


def test_hunt_offers_every_generic_machine() -> None:
    assert hunt_cli.MACHINES == MACHINES

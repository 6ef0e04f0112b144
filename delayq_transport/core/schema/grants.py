"""Least-privilege roles: the GRANTs each kind of role needs (``delayq grants``).

Only ``delayq migrate`` needs DDL; the statements themselves live in ``schema.sql`` (blocks
``grant_*``), rendered here per role with quoted identifiers. See docs/how-to/roles.md.
"""

from __future__ import annotations

from ..db.errors import InvalidInput
from ..db.queries import grant_statements

#: ``delayq grants --as PROFILE``: the grant_* blocks each kind of role needs.
ROLE_PROFILES: dict[str, tuple[str, ...]] = {
    "admin": ("admin",),
    "worker": ("worker", "beat"),
    "producer": ("producer",),
    "monitor": ("monitor",),
}


def grants_for(profile: str, *, table: str, role: str, schema: str = "public") -> list[str]:
    """Every GRANT a role of this profile needs on ``schema`` (see docs/how-to/roles.md)."""
    if profile not in ROLE_PROFILES:
        raise InvalidInput(f"unknown role profile {profile!r}: one of {sorted(ROLE_PROFILES)}")
    return [s for block in ROLE_PROFILES[profile]
            for s in grant_statements(block, table=table, role=role, schema=schema)]

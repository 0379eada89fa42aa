"""Validated identifiers that reach paths, databases and services.

Every id a caller chooses or quotes (tenant, session, partition, job, key, future,
role, domain) must match one conservative pattern: it starts with a letter or digit
and continues with letters, digits, ``_``, ``.``, ``-``. No ``/``, no leading dot, so
no id can climb out of a tenant's output directory, and the length is bounded.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path
from pydantic import Field

__all__ = [
    "NAME_PATTERN",
    "Name",
    "PathName",
    "TenantId",
]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

#: A validated id in a JSON body.
Name = Annotated[str, Field(pattern=NAME_PATTERN, min_length=1, max_length=128)]
#: A validated tenant id (the workload spec's tenant-name rule).
TenantId = Annotated[str, Field(pattern=TENANT_PATTERN, min_length=1, max_length=64)]
#: A validated id in a URL path.
PathName = Annotated[str, Path(pattern=NAME_PATTERN, min_length=1, max_length=128)]

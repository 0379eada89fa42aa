"""Tenants and API keys: who may call the server, and as whom.

An API key reads ``jnx_<key_id>_<secret>``. The store keeps, per key, the key id, the
owner (a tenant, or the admin role), a random salt and ``scrypt(secret, salt)`` —
never the secret itself — so a leaked database does not leak usable keys. Checking a
key looks the row up by its id and compares digests with :func:`hmac.compare_digest`.

scrypt is deliberately slow (milliseconds), which is right once per key but wrong on
every request, so a key that verified once is remembered in this process as an HMAC
under a per-process random secret; later requests pay one HMAC. Revoking a key through
this store drops it from that cache at once (a second server process sharing the
database would keep a revoked key until it restarts: run one server per database).

Admin keys may create tenants and keys and list them; tenant keys act as their
tenant. Data lives in SQLite (a file in the run dir, or ``:memory:``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from joynexus.control.integrity import TENANT_STORE_FILE, check_tenant_store
from joynexus.errors import ConflictError, InvalidRequestError, NotFoundError
from joynexus.server.config import TenantQuotas
from joynexus.server.names import TENANT_PATTERN
from joynexus.utils.clock import Clock, SystemClock

__all__ = ["IssuedKey", "KeyRecord", "Principal", "Role", "TenantRecord", "TenantStore"]

Role = Literal["admin", "tenant"]

_KEY_PREFIX = "jnx"
_KEY_ID_HEX = 16
# scrypt cost: 16 MiB and ~tens of ms per verification; the verified-key cache makes
# this a once-per-key-per-process cost.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 1 << 14, 8, 1
_MAX_KEY_LEN = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    tenant_id   TEXT PRIMARY KEY,
    created_at  REAL NOT NULL,
    quotas_json TEXT
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id      TEXT PRIMARY KEY,
    tenant_id   TEXT,
    role        TEXT NOT NULL,
    salt        BLOB NOT NULL,
    digest      BLOB NOT NULL,
    created_at  REAL NOT NULL,
    revoked     INTEGER NOT NULL DEFAULT 0,
    label       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS api_keys_tenant ON api_keys (tenant_id);
"""


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request, as established by its API key."""

    role: Role
    key_id: str
    tenant_id: str | None = None


@dataclass(frozen=True, slots=True)
class TenantRecord:
    tenant_id: str
    created_at: float
    quotas: TenantQuotas | None


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as listed: never its secret."""

    key_id: str
    role: Role
    tenant_id: str | None
    created_at: float
    revoked: bool
    label: str


@dataclass(frozen=True, slots=True)
class IssuedKey:
    """A freshly created key; ``api_key`` is shown once and stored only hashed."""

    api_key: str
    record: KeyRecord


def _digest(secret: str, salt: bytes) -> bytes:
    return hashlib.scrypt(
        secret.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32
    )


def _split_key(api_key: str) -> tuple[str, str] | None:
    if not api_key or len(api_key) > _MAX_KEY_LEN:
        return None
    parts = api_key.split("_", 2)
    if len(parts) != 3 or parts[0] != _KEY_PREFIX:
        return None
    key_id, secret = parts[1], parts[2]
    if len(key_id) != _KEY_ID_HEX or not all(c in "0123456789abcdef" for c in key_id):
        return None
    return (key_id, secret) if secret else None


class TenantStore:
    """Tenants and their hashed API keys in SQLite.

    The server that opens the store is its only writer (its run directory's lock), tenant
    rows never change once created, and a key changes only by this store's
    :meth:`revoke_key`. So a verified key's principal and a tenant's record are kept in
    memory: a predict authenticates and reads its tenant's quotas without a database
    query (two queries on the event loop per request before).

    Args:
        path: The database file, or ``":memory:"`` (see :meth:`in_memory`).
        clock: Source of ``created_at`` timestamps.
    """

    def __init__(self, path: str | Path = ":memory:", *, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._pepper = secrets.token_bytes(32)
        # key id → (keyed hash of the whole key, its principal), once verified.
        self._verified: dict[str, tuple[bytes, Principal]] = {}
        self._tenants: dict[str, TenantRecord] = {}
        with self._lock:
            self._db.executescript(_SCHEMA)

    @classmethod
    def in_memory(cls, *, clock: Clock | None = None) -> TenantStore:
        """A store that lives only in this process (tests, ephemeral servers)."""
        return cls(":memory:", clock=clock)

    @classmethod
    def open(cls, path: str | Path, *, clock: Clock | None = None) -> TenantStore:
        """A durable store on the SQLite file ``path`` (created when missing)."""
        return cls(path, clock=clock)

    @classmethod
    def open_run_dir(
        cls, run_dir: Path, *, admin_key_file: Path, clock: Clock | None = None
    ) -> TenantStore:
        """The durable store of a server's run directory (``tenants.sqlite``), refused
        when it is lost or damaged beside existing state.

        Args:
            run_dir: The server's run directory.
            admin_key_file: Where the server keeps its admin key.
            clock: Source of ``created_at`` timestamps.

        Raises:
            RunDirStateError: see :func:`joynexus.control.integrity.check_tenant_store`
                (the message says how to recover).
        """
        check_tenant_store(run_dir, admin_key_file=admin_key_file)
        return cls.open(Path(run_dir) / TENANT_STORE_FILE, clock=clock)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ tenants

    def create_tenant(self, tenant_id: str, *, quotas: TenantQuotas | None = None) -> TenantRecord:
        """Register a tenant.

        Raises:
            InvalidRequestError: ``tenant_id`` does not match the tenant-name rule.
            ConflictError: the tenant exists already.
        """
        if not isinstance(tenant_id, str) or not re.fullmatch(TENANT_PATTERN, tenant_id):
            raise InvalidRequestError(
                f"tenant id {tenant_id!r} is invalid; expected 1-64 letters, digits, '_', '.', "
                "'-' starting with a letter or digit",
                field="tenant_id",
                pattern=TENANT_PATTERN,
            )
        now = self._clock.wall()
        quotas_json = None if quotas is None else quotas.model_dump_json()
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO tenants (tenant_id, created_at, quotas_json) VALUES (?, ?, ?)",
                    (tenant_id, now, quotas_json),
                )
            except sqlite3.IntegrityError:
                raise ConflictError(
                    f"tenant {tenant_id!r} already exists", tenant_id=tenant_id
                ) from None
        return TenantRecord(tenant_id, now, quotas)

    def get_tenant(self, tenant_id: str) -> TenantRecord:
        """Raises NotFoundError for an unknown tenant."""
        known = self._tenants.get(tenant_id)
        if known is not None:
            return known
        with self._lock:
            row = self._db.execute(
                "SELECT tenant_id, created_at, quotas_json FROM tenants WHERE tenant_id = ?",
                (tenant_id,),
            ).fetchone()
        if row is None:
            raise NotFoundError(f"no tenant {tenant_id!r}", tenant_id=tenant_id)
        record = _tenant(row)
        self._tenants[tenant_id] = record
        return record

    def list_tenants(self) -> list[TenantRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT tenant_id, created_at, quotas_json FROM tenants ORDER BY created_at, "
                "tenant_id"
            ).fetchall()
        return [_tenant(r) for r in rows]

    # --------------------------------------------------------------------- keys

    def create_key(self, tenant_id: str, *, label: str = "") -> IssuedKey:
        """Issue a new API key for an existing tenant."""
        self.get_tenant(tenant_id)
        return self._issue("tenant", tenant_id, label)

    def create_admin_key(self, *, label: str = "admin") -> IssuedKey:
        """Issue a new admin key (creates tenants and keys; owns no tenant data)."""
        return self._issue("admin", None, label)

    def _issue(self, role: Role, tenant_id: str | None, label: str) -> IssuedKey:
        key_id = secrets.token_hex(_KEY_ID_HEX // 2)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        now = self._clock.wall()
        with self._lock:
            self._db.execute(
                "INSERT INTO api_keys (key_id, tenant_id, role, salt, digest, created_at, label) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key_id, tenant_id, role, salt, _digest(secret, salt), now, label[:128]),
            )
        record = KeyRecord(key_id, role, tenant_id, now, False, label[:128])
        return IssuedKey(f"{_KEY_PREFIX}_{key_id}_{secret}", record)

    def list_keys(self, tenant_id: str | None = None) -> list[KeyRecord]:
        """Keys of one tenant (or every key), without secrets."""
        query = "SELECT key_id, role, tenant_id, created_at, revoked, label FROM api_keys"
        args: tuple[str, ...] = ()
        if tenant_id is not None:
            query += " WHERE tenant_id = ?"
            args = (tenant_id,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at, rowid", args).fetchall()
        return [KeyRecord(r[0], r[1], r[2], r[3], bool(r[4]), r[5]) for r in rows]

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key; later requests with it answer 401. NotFoundError if unknown."""
        with self._lock:
            cur = self._db.execute("UPDATE api_keys SET revoked = 1 WHERE key_id = ?", (key_id,))
            self._verified.pop(key_id, None)
        if cur.rowcount == 0:
            raise NotFoundError(f"no API key {key_id!r}", key_id=key_id)

    def authenticate(self, api_key: str) -> Principal | None:
        """The principal of ``api_key``, or None for a malformed, unknown or revoked key."""
        parts = _split_key(api_key)
        if parts is None:
            return None
        key_id, secret = parts
        fast = hmac.new(self._pepper, api_key.encode(), hashlib.sha256).digest()
        with self._lock:
            cached = self._verified.get(key_id)
        if cached is not None:
            # A revoked key left this table in revoke_key; any other secret for this id
            # fails the comparison.
            return cached[1] if hmac.compare_digest(cached[0], fast) else None
        with self._lock:
            row = self._db.execute(
                "SELECT role, tenant_id, salt, digest, revoked FROM api_keys WHERE key_id = ?",
                (key_id,),
            ).fetchone()
        if row is None or row[4]:
            return None
        role, tenant_id, salt, digest = row[0], row[1], row[2], row[3]
        if not hmac.compare_digest(_digest(secret, salt), digest):
            return None
        principal = Principal(role=role, key_id=key_id, tenant_id=tenant_id)
        with self._lock:
            revoked = self._db.execute(
                "SELECT revoked FROM api_keys WHERE key_id = ?", (key_id,)
            ).fetchone()
            if revoked is not None and not revoked[0]:  # not revoked while we verified
                self._verified[key_id] = (fast, principal)
        return principal


def _tenant(row: tuple[str, float, str | None]) -> TenantRecord:
    quotas = None if row[2] is None else TenantQuotas.model_validate(json.loads(row[2]))
    return TenantRecord(row[0], row[1], quotas)

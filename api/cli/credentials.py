"""Who the CLI is to services with access control on: one spelling of the caller's keys for every command.

``--access-key`` / ``--secret-key``, or the environment variables ``SPARKMQ_ACCESS_KEY`` / ``SPARKMQ_SECRET_KEY``
(better for the secret: a command line is visible to every user of the machine).  Given together they sign every
request the command makes (docs/security.md); neither = unsigned.  The secret is never printed.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ...platform.auth import Credentials

__all__ = ["ACCESS_KEY_ENV", "SECRET_KEY_ENV", "credential_options", "credentials_of"]

F = TypeVar("F", bound=Callable[..., Any])

#: The environment variables the keys fall back to (``sparkmq admin``, ``produce``, ``consume``, ``lake``).
ACCESS_KEY_ENV = "SPARKMQ_ACCESS_KEY"
SECRET_KEY_ENV = "SPARKMQ_SECRET_KEY"


def credential_options(fn: F) -> F:
    """Add ``--access-key`` and ``--secret-key`` (parameters ``access_key``, ``secret_key``) to a command."""
    fn = click.option("--secret-key", envvar=SECRET_KEY_ENV, default=None, metavar="SECRET",
                      help=f"its secret key; prefer env {SECRET_KEY_ENV} (a command line is visible to other "
                           "users)")(fn)
    return click.option("--access-key", envvar=ACCESS_KEY_ENV, default=None,
                        help=f"sign requests as this user, for services with ACL on (env {ACCESS_KEY_ENV})")(fn)


def credentials_of(access_key: str | None, secret_key: str | None) -> Credentials | None:
    """The keys of :func:`credential_options` (None when neither is given); a usage error when only one is, or
    one is not a legal key (the message never shows the secret)."""
    if not access_key and not secret_key:
        return None
    if not (access_key and secret_key):
        missing = "--secret-key" if access_key else "--access-key"
        raise click.UsageError(f"{missing} is missing: the access key and the secret key go together "
                               f"(or {ACCESS_KEY_ENV} and {SECRET_KEY_ENV})")
    try:
        return Credentials(access_key.strip(), secret_key)
    except ValueError as exc:
        raise click.UsageError(f"--access-key / --secret-key: {exc}") from None

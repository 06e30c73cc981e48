"""The admin key as the console knows it, kept in step with the registry's.

The registry holds the one admin key (`agentreach admin-key rotate` replaces it) and the console
learns of a rotation the way any HTTP client would: the registry refuses its key (the collector
asks it about once a second). It then reads DATA_DIR/admin.key again, where the rotation wrote
the new key; when that gives nothing new (a console given its key by flag or environment), it
stops honouring the refused key until an operator signs in with one the registry accepts. Every
change of key moves ``generation`` on, which ends the sessions opened before it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from auth.secrets import ADMIN_KEY_PREFIX, digest, matches

log = logging.getLogger("agentreach.console.admin_key")


def could_be_admin_key(key: str) -> bool:
    """Worth asking the registry about: shaped like the keys it makes (``ara_`` + 43 characters)."""
    return key.startswith(ADMIN_KEY_PREFIX) and len(key) == len(ADMIN_KEY_PREFIX) + 43


class AdminKey:
    def __init__(self, key: str | None, reread: Callable[[], str | None]):
        self.key = key
        self.generation = 0
        self._digest = digest(key) if key else None
        self._reread = reread

    def is_admin(self, key: str) -> bool:
        return self._digest is not None and matches(key, self._digest)

    def refused(self, sent: str | None, final: bool) -> bool:
        """An upstream answered 401 to a call carrying ``sent``. Returns whether there is now another
        key to retry with. ``final``: the refusal came from the registry, whose word on the key is final
        (a router elsewhere may not have heard of a rotation yet)."""
        if sent != self.key:
            return self.key is not None  # another call has dealt with this refusal already
        fresh = self._reread()
        if fresh is not None and fresh != sent:
            self._take(fresh, "the admin key was refused; took the one now in admin.key")
            return True
        if final and sent is not None:
            self._take(None, "the registry refused the admin key and admin.key holds no newer one: sign in "
                             "with the current key")
        return False

    def accepted(self, key: str) -> None:
        """The registry accepted ``key`` as the admin key (an operator presented it)."""
        if key != self.key:
            self._take(key, "an operator presented the registry's current admin key; the console uses it now")

    def _take(self, key: str | None, why: str) -> None:
        self.key = key
        self._digest = digest(key) if key else None
        self.generation += 1
        log.warning(why, extra={"generation": self.generation})
